"""Prefect flows (`jf-round`, `jf-progressive`, `jf-bootstrap`) chaining the tasks package; see the orchestration
issue. Nothing here yet."""
