"""Flow `jf-bootstrap`: train and cache the embedded default model (a no-op when it is cached)."""

from __future__ import annotations

from prefect import flow, get_run_logger, task


@task(name="bootstrap-embedded-model", retries=1)
def bootstrap_embedded(threads: int | None = None) -> str:
    from jacobi_forcing.tasks.run_logs import library_warnings_in_run_log
    from jf_core.toy.bootstrap import BootstrapConfig, ensure_embedded_model

    with library_warnings_in_run_log():
        return str(ensure_embedded_model(BootstrapConfig(threads=threads)))


@flow(name="jf-bootstrap", log_prints=True)
def jf_bootstrap(threads: int | None = None) -> str:
    """`threads`: torch CPU threads for the training (None: every CPU this process may use); part of the model's key."""
    path = bootstrap_embedded(threads)
    get_run_logger().info("embedded model at %s", path)
    return path
