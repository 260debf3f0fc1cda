"""A Jacobi Forcing round as library code, with no Prefect, Ray or MLflow in it:

- `paths`: where a round lives and what keys its directories (input model, prompts, trajectory and training configs);
- `stages`: pack -> train -> tune -> evaluate over those paths, each resumable and reused when finished;
- `training`: the one training driver, run by one process and by every Ray Train worker alike;
- `collection`: the trajectory stage's shards, shared by the Ray actor pool and the in-process collector;
- `report`: the round's report, the names every consumer reads.

The orchestration layer adds what needs a cluster or a tracking server: trajectories on a Ray actor pool
(tasks/trajectories.py), training on Ray Train workers (tasks/train_distributed.py), Prefect tasks
(tasks/round_tasks.py), MLflow (tasks/mlflow_runs.py, tasks/registry.py) and the flow (flows/round.py).
"""
