"""MLflow for rounds: where runs go, what a round logs, and the registry with its champion gate.

Runs are driven through `MlflowClient` with explicit run ids (a parent run per flow run, a nested run per round),
never the fluent "active run", because Prefect may run tasks in other threads than the flow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from jf_core.config import Profile, RegistryConfig
from jf_core.evaluation.gate import GateDecision, decide
from jf_core.paths import jf_home

PYFUNC_ENTRY = Path(__file__).with_name("pyfunc.py")


def tracking_uri(cfg: RegistryConfig) -> str:
    if cfg.tracking_uri:
        return cfg.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{jf_home() / 'mlflow' / 'mlflow.db'}"


def local_artifact_root() -> Path:
    return jf_home() / "mlflow" / "artifacts"


def connect(profile: Profile) -> tuple[MlflowClient, str]:
    """Point MLflow at the profile's store and return (client, experiment id), creating the experiment once."""
    uri = tracking_uri(profile.registry)
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


def round_metrics(report: dict) -> dict[str, float]:
    m = {
        "accuracy": report["accuracy"],
        "base_accuracy": report["base_accuracy"],
        "accuracy_drop": report["base_accuracy"] - report["accuracy"],
        "tpf": report["headline_tpf"],
        "tps": report["headline_tps"],
        "tps_ar": report["tps"]["ar"],
        "speedup_vs_ar": report["speedup_vs_ar"],  # the headline: against our own AR on the same model
        "speedup_vs_hf_generate": report["speedup_vs_hf_generate"],
        "identical_fraction": report["identical_fraction"],  # with greedy AR: 1.0 in fp32, measured in bf16
        "train_seconds": report["train_seconds"],
    }
    if report.get("tuned"):
        m.update(tuned_tpf=report["tuned"]["tpf"], tuned_tps=report["tuned"]["tps"])
        m["tuned_speedup_vs_ar"] = report["tuned"]["speedup_vs_ar"]
    for n, v in report["tpf"].items():
        m[f"tpf_n{n}"] = v
    for n, v in report["base_tpf"].items():
        m[f"base_tpf_n{n}"] = v
    for name, v in report["tps"].items():
        m[f"tps_{name}"] = v
    return m


def log_round(client: MlflowClient, run_id: str, report: dict, plots: dict[str, object]) -> None:
    """Metrics (loss curves per step, the round's results), plots, the report JSON and the trajectory input."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    curve = [
        Metric(k, float(v), now, int(row["step"]))
        for row in report["loss_curve"]
        for k, v in row.items()
        if k != "step"
    ]
    curve += [Metric(k, float(v), now, 0) for k, v in round_metrics(report).items()]
    for i in range(0, len(curve), 1000):
        client.log_batch(run_id, metrics=curve[i : i + 1000])
    for name, fig in plots.items():
        client.log_figure(run_id, fig, f"plots/{name}.png")
    client.log_dict(run_id, {k: v for k, v in report.items() if k != "loss_curve"}, "eval/report.json")
    log_trajectory_input(client, run_id, Path(report["round_dir"]) / "trajectories", report)


def log_trajectory_input(client: MlflowClient, run_id: str, store: Path, report: dict) -> None:
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    manifest = Path(report["trajectories"]["out"]) / "manifest.json"
    if not manifest.is_file():
        manifest = store / "manifest.json"
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
    dataset = MetaDataset(resolve_dataset_source(str(manifest.parent)), name="trajectories", digest=digest)
    entity = dataset._to_mlflow_entity()
    client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])])
    client.log_artifact(run_id, str(manifest), "trajectories")


def champion(client: MlflowClient, name: str):
    try:
        return client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None


def register(client: MlflowClient, run_id: str, profile: Profile, report: dict) -> tuple[str, GateDecision]:
    """Log the model as a Jacobi Forcing pyfunc, register a new version with its figures as tags, alias it
    `challenger`, and `champion` only when the gate passes. Returns (version, decision)."""
    name = profile.model_name
    current = champion(client, name)
    champion_tpf = float(current.tags["tpf"]) if current is not None and "tpf" in current.tags else None
    decision = decide(
        accuracy=report["accuracy"],
        input_accuracy=report["base_accuracy"],
        tpf=report["headline_tpf"],
        champion_tpf=champion_tpf,
        cfg=profile.registry.gate,
    )
    with tempfile.TemporaryDirectory() as tmp:
        decode = Path(tmp) / "decode_config.json"
        tuned = Path(report["model"]) / "decode_config.json"
        decode.write_text(tuned.read_text() if tuned.is_file() else json.dumps(report["decode_config"], indent=2))
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=_pyfunc_model(),
                artifacts={"model_dir": report["model"], "decode_config": str(decode)},
                pip_requirements=["torch", "transformers>=5,<6", "safetensors", "jacobi-forcing"],
            )
    tags = {
        "round": Path(report["round_dir"]).name,
        "n": str(report["block_size"]),
        "tpf": repr(float(report["headline_tpf"])),  # full precision: the gate compares against it
        "tps": f"{report['headline_tps']:.2f}",
        "speedup_vs_ar": f"{report['speedup_vs_ar']:.3f}",  # the headline: against our own AR, same model
        "identical_fraction": f"{report['identical_fraction']:.4f}",
        "dtype": report["dtype"],
        "accuracy": f"{report['accuracy']:.4f}",
        "base_model": report["model_in"],
        "gate": "passed" if decision.passed else "failed",
        "gate_reasons": "; ".join(decision.reasons),
    }
    version = mlflow.register_model(info.model_uri, name, tags=tags).version
    client.set_registered_model_alias(name, "challenger", version)
    if decision.passed:
        client.set_registered_model_alias(name, "champion", version)
    client.set_tag(run_id, "jf.registered_version", version)
    client.set_tag(run_id, "jf.gate", tags["gate"])
    return str(version), decision


def _pyfunc_model():
    from tasks.pyfunc import JacobiForcingModel

    return JacobiForcingModel()


def resolve_model(uri: str, profile: Profile) -> str:
    """A round's starting model as a local directory: `models:/<name>@<alias>` or `models:/<name>/<version>` are
    downloaded once per version; anything else (a directory, a hub id, "embedded") goes through the profile."""
    if not uri.startswith("models:/"):
        return profile.model.model_copy(update={"path": uri}).resolve()
    client, _ = connect(profile)
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        try:
            mv = client.get_model_version_by_alias(name, alias)
        except MlflowException as err:
            raise ValueError(f"model {uri}: registered model {name!r} has no alias {alias!r}") from err
    else:
        name, _, version = ref.partition("/")
        mv = client.get_model_version(name, version)
    dest = jf_home() / "models" / "registry" / f"{name}-v{mv.version}"
    if not (dest / "model_dir" / "config.json").is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
            mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{mv.version}", dst_path=tmp)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(Path(tmp) / "artifacts", dest)  # the pyfunc's artifacts: model_dir/, decode_config.json
    return str(dest / "model_dir")
