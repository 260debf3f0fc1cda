"""Prefect flows: `jf-round` (flows/round.py), `jf-progressive` (flows/progressive.py) and `jf-bootstrap`
(flows/bootstrap.py). Flows call tasks/, tasks call jf_core; deployments are declared in prefect.yaml."""
