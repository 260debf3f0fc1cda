"""Thin Prefect tasks over jf_core, Ray and MLflow. They pass paths and URIs, never models or tables.

`round_tasks` (a round's stages as tasks), `trajectories` (the Ray actor pool), `train_distributed` (Ray Train
workers), `mlflow_runs`, `registry`, `model_package` and `mlflow_model` (tracking, the registry and its gate, a model
directory as a registered model), `reporting` (what a round shows people), `events`, `gpu_slots` and `run_logs`."""
