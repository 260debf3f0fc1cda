"""MLflow runs of the flows: where they go, how one is opened and always closed, and what a round logs.

Runs are driven through `MlflowClient` with explicit run ids (a parent run per flow run, a nested run per round),
never the fluent "active run", because Prefect may run tasks in other threads than the flow. `mlflow_run` opens one
and closes it FINISHED or FAILED whatever happens inside; `reap` closes the ones a killed process never could.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from jf_core.config import Profile, RegistryConfig
from jf_core.paths import jf_home

if TYPE_CHECKING:
    from jf_core.round.report import RoundReport, Threads


def tracking_uri(cfg: RegistryConfig) -> str:
    if cfg.tracking_uri:
        return cfg.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{jf_home() / 'mlflow' / 'mlflow.db'}"


def local_artifact_root() -> Path:
    return jf_home() / "mlflow" / "artifacts"


class TrackingUnreachable(RuntimeError):
    pass


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """An MLflow server that does not answer fails here, in seconds and by name, instead of after the client's
    minutes of retries with a connection error that names neither the server nor what was kept."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout).close()
    except OSError as err:
        raise TrackingUnreachable(
            f"the MLflow tracking server {uri} is not reachable ({getattr(err, 'reason', err)}); the round's "
            "finished stages are kept: start the server and re-run, and only what had not finished runs again"
        ) from None


def connect(profile: Profile) -> tuple[MlflowClient, str]:
    """Point MLflow at the profile's store and return (client, experiment id), creating the experiment once."""
    uri = tracking_uri(profile.registry)
    check_reachable(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    # The registry follows the tracking URI. (mlflow.set_registry_uri would export MLFLOW_REGISTRY_URI to every
    # later subprocess of this process, pinning them to this store.)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri, uri)
    name = profile.registry.experiment
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return client, exp.experiment_id
    # A file store keeps artifacts beside the database; a server decides for itself (proxied artifacts).
    location = local_artifact_root().as_uri() if uri.startswith(("sqlite:", "file:")) or "://" not in uri else None
    try:
        return client, client.create_experiment(name, artifact_location=location)
    except MlflowException:  # created meanwhile by a concurrent flow run
        return client, client.get_experiment_by_name(name).experiment_id


def run_url(profile: Profile, experiment_id: str, run_id: str) -> str | None:
    base = profile.registry.ui_url or tracking_uri(profile.registry)
    if not base.startswith(("http://", "https://")):
        return None
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def start_run(client: MlflowClient, experiment_id: str, name: str, *, parent: str | None = None, tags=None) -> str:
    tags = dict(tags or {})
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    return client.create_run(experiment_id, run_name=name, tags=tags).info.run_id


@contextmanager
def mlflow_run(
    client: MlflowClient,
    experiment_id: str,
    name: str,
    *,
    profile: Profile,
    parent: str | None = None,
    tags: dict | None = None,
    adopt: str | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> Iterator[str]:
    """A run for the `with` block, closed FINISHED when the block completes and FAILED when anything leaves it
    (a cancellation or a SIGTERM too). `adopt`: a run the caller opened and will close (a calling flow's parent
    run), yielded as it is and left open. `logger`: where a failure to close is said (the flow run's logger).
    Closing a failed run first checks that the store answers (seconds, not the client's minutes of retries), and
    an error while closing is logged, never raised over the block's own: the next round's `reap` closes what was
    left."""
    if adopt is not None:
        yield adopt
        return
    run_id = start_run(client, experiment_id, name, parent=parent, tags=tags)
    try:
        yield run_id
    except BaseException:
        try:
            check_reachable(tracking_uri(profile.registry), timeout=5)
            client.set_terminated(run_id, "FAILED")
        except Exception as err:  # MLflow itself may be what failed: keep the original error
            (logger or logging.getLogger("jf.mlflow")).warning(
                "could not close MLflow run %s as FAILED (%s); the next round's reaper will", run_id, err
            )
        raise
    client.set_terminated(run_id, "FINISHED")


def _flatten(prefix: str, obj, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(obj) if isinstance(obj, list) else str(obj)
    return out


def log_params(client: MlflowClient, run_id: str, profile: Profile) -> None:
    from mlflow.entities import Param

    params = [Param(k, v[:6000]) for k, v in _flatten("", profile.model_dump(mode="json"), {}).items()]
    for i in range(0, len(params), 100):  # MLflow's batch limit
        client.log_batch(run_id, params=params[i : i + 100])


def thread_params(threads: Threads) -> dict[str, object]:
    """The round's thread counts as flat params (`threads.train_policy`, `threads.train_initial`, ...)."""
    # A run no governor watched (on a GPU) has no counts to log.
    train = threads.train.model_dump(exclude={"changes"}) if threads.train.policy is not None else {}
    out: dict[str, object] = {f"train_{k}": v for k, v in train.items()}
    out.update({k: v for k, v in threads.model_dump(exclude={"train"}).items() if v is not None})
    return out


def log_round(client: MlflowClient, run_id: str, report: RoundReport, plots: dict[str, object]) -> None:
    """Metrics (loss curves per step, the round's results), plots, the report JSON and the trajectory input."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    curve = [
        Metric(k, float(v), now, int(row["step"]))
        for row in report.train.history
        for k, v in row.items()
        if k != "step"
    ]
    curve += [Metric(k, float(v), now, 0) for k, v in report.metrics().items()]
    threads = report.threads
    # The training thread count over steps: a flat line alone, a step down where another process took a core.
    curve += [Metric("torch_threads", float(n), now, int(step)) for step, n in threads.train.changes]
    params = [Param(f"threads.{k}", str(v)) for k, v in thread_params(threads).items()]
    if report.train.compute_dtype is not None:  # what training's matmuls ran in (training.compute_dtype may say auto)
        params.append(Param("train.compute_dtype", report.train.compute_dtype))
    client.log_batch(run_id, params=params)
    for i in range(0, len(curve), 1000):
        client.log_batch(run_id, metrics=curve[i : i + 1000])
    import matplotlib.pyplot as plt

    for name, fig in plots.items():
        client.log_figure(run_id, fig, f"plots/{name}.png")
        plt.close(fig)  # pyplot holds every figure until closed: a worker running round after round would pile them up
    # The report as report.json holds it (the loss curve is the run's metrics already).
    client.log_dict(run_id, report.model_dump(mode="json", exclude={"train": {"history"}}), "eval/report.json")
    # The trajectories the stage wrote (shared between rounds of one model), else the round's own directory.
    log_trajectory_input(client, run_id, Path(report.trajectories.out), Path(report.round_dir) / "trajectories")


def log_trajectory_input(client: MlflowClient, run_id: str, *stores: Path) -> None:
    """The first of `stores` holding a manifest, as the run's training input dataset (and its manifest)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag

    manifest = next((m for m in (store / "manifest.json" for store in stores) if m.is_file()), None)
    if manifest is None:
        raise FileNotFoundError(f"no trajectory manifest in {', '.join(map(str, stores))}")
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
    with warnings.catch_warnings():
        # MLflow registers one local-file source for the "" scheme and one for "file://", both named
        # LocalArtifactDatasetSource, and warns on every local path that it cannot tell them apart: they are the same.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        source = resolve_dataset_source(str(manifest.parent))
    dataset = MetaDataset(source, name="trajectories", digest=digest).to_dict()  # its public form, as plain fields
    entity = Dataset(**{k: dataset.get(k) for k in ("name", "digest", "source_type", "source", "schema", "profile")})
    client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])])
    client.log_artifact(run_id, str(manifest), "trajectories")


ENDED = ("CRASHED", "FAILED", "CANCELLED")  # Prefect state types after which nothing will close a run


def reap(client: MlflowClient, experiment_id: str, state_of: Callable[[str], str | None]) -> list[str]:
    """Close the MLflow runs a dead flow run left `RUNNING`: every running run tagged with a Prefect flow run whose
    state (`state_of(flow_run_id)`, a state type) is crashed, failed or cancelled is set `FAILED` and tagged
    `jf.closed_by`. A worker killed mid-round never got to close its runs; its flow run is marked `Crashed` by the
    stack's automation (infra/automations.py). Returns the ids closed."""
    closed = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
        flow_run_id = run.data.tags.get("prefect.flow_run_id")
        state = state_of(flow_run_id) if flow_run_id else None
        if state in ENDED:
            client.set_tag(run.info.run_id, "jf.closed_by", f"Prefect flow run {flow_run_id} ended {state}")
            client.set_terminated(run.info.run_id, "FAILED")
            closed.append(run.info.run_id)
    return closed
