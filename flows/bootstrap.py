"""Flow `jf-bootstrap`: train and cache the embedded default model (a no-op when it is cached)."""

from __future__ import annotations

from prefect import flow, get_run_logger, task


@task(name="bootstrap-embedded-model", retries=1)
def bootstrap_embedded() -> str:
    from jf_core.toy.bootstrap import ensure_embedded_model

    return str(ensure_embedded_model())


@flow(name="jf-bootstrap", log_prints=True)
def jf_bootstrap() -> str:
    path = bootstrap_embedded()
    get_run_logger().info("embedded model at %s", path)
    return path
