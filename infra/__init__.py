"""How the servers and clusters start: the local stack (stack.py), Ray cluster and KubeRay manifests (README.md)."""
