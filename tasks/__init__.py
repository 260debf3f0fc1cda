"""Thin Prefect tasks over jf_core, Ray and MLflow. They pass paths and URIs, never models or tables.

The orchestration issue fills this package (trajectories, pack, train, evaluate, register); nothing here yet."""
