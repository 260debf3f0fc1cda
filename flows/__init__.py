"""Prefect flows: `jf-round` (flows/round.py), `jf-progressive` (flows/progressive.py), `jf-bootstrap`
(flows/bootstrap.py), `jf-benchmark` (flows/benchmark.py) and `jf-ablate` (flows/ablate.py). Flows call tasks/,
tasks call jf_core; deployments are declared in prefect.yaml."""
