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
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

import jf_core
from jf_core.config import Profile, RegistryConfig
from jf_core.evaluation.gate import Check, Figures, GateDecision, decide
from jf_core.paths import jf_home
from jf_core.serving.artifact import read_block


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
        "lineage_base_accuracy": report["lineage_base_accuracy"],
        **{f"output_{k}": v for k, v in report["output_stats"].items()},  # what the gate's degeneracy checks read
        **{f"base_output_{k}": v for k, v in report["base_output_stats"].items()},
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


def thread_params(threads: dict) -> dict[str, object]:
    """The round's thread counts as flat params (`threads.train_policy`, `threads.train_initial`, ...)."""
    train = threads.get("train") or {}
    out: dict[str, object] = {
        f"train_{k}": train[k] for k in ("policy", "budget", "initial", "final", "min", "contended_at") if k in train
    }
    out.update({k: v for k, v in threads.items() if k != "train" and v is not None})
    return out


def log_round(client: MlflowClient, run_id: str, report: dict, plots: dict[str, object]) -> None:
    """Metrics (loss curves per step, the round's results), plots, the report JSON and the trajectory input."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    curve = [
        Metric(k, float(v), now, int(row["step"]))
        for row in report["loss_curve"]
        for k, v in row.items()
        if k != "step"
    ]
    curve += [Metric(k, float(v), now, 0) for k, v in round_metrics(report).items()]
    threads = report.get("threads") or {}
    # The training thread count over steps: a flat line alone, a step down where another process took a core.
    curve += [
        Metric("torch_threads", float(n), now, int(step)) for step, n in threads.get("train", {}).get("changes", [])
    ]
    client.log_batch(run_id, params=[Param(f"threads.{k}", str(v)) for k, v in thread_params(threads).items()])
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
    with warnings.catch_warnings():
        # MLflow registers one local-file source for the "" scheme and one for "file://", both named
        # LocalArtifactDatasetSource, and warns on every local path that it cannot tell them apart: they are the same.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        source = resolve_dataset_source(str(manifest.parent))
    dataset = MetaDataset(source, name="trajectories", digest=digest)
    entity = dataset._to_mlflow_entity()
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


def champion(client: MlflowClient, name: str):
    try:
        return client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None


def champion_figures(client: MlflowClient, name: str, eval_key: str) -> tuple[object, Figures | None]:
    """(the champion's version, its gate figures when they were measured on the evaluation `eval_key`); versions
    registered before the gate recorded figures, or measured on another evaluation, give None: re-evaluate them."""
    current = champion(client, name)
    if current is None or "jf.figures" not in current.tags:
        return current, None
    figures = Figures.from_json(current.tags["jf.figures"])
    return current, figures if figures.eval_key == eval_key else None


def registration_key(profile: Profile, report: dict) -> str:
    """What makes a registration the same one again: the round (its directory names its inputs), the model it
    started from, the figures the gate read and the gate itself. A fully cached re-run has the same key."""
    parts = {
        "round": Path(report["round_dir"]).name,
        "model_in": report["model_in"],
        "accuracy": report["accuracy"],
        "base_accuracy": report["base_accuracy"],
        "tpf": report["headline_tpf"],
        "gate": profile.registry.gate.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _registered(client: MlflowClient, name: str, key: str):
    """The version registered under `key` earlier, if any (a model holds few versions: read them all)."""
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get("jf.registration_key") == key), None)


class Registration(NamedTuple):
    version: str
    decision: GateDecision
    # this call set the `champion` alias: a passing new version, or a re-run finishing a killed registration's
    # promotion (what the champion-changed event is sent on)
    champion_moved: bool


def _reuse(client: MlflowClient, name: str, found) -> Registration:
    """A re-run of a registered round: its version and verdict as recorded. A registration that was killed before
    its alias moves were done (no `jf.registration: complete` tag) has them finished, never moving an alias back
    from a newer version; a complete one moves nothing (an operator's later rollback stays)."""
    version, passed = str(found.version), found.tags.get("gate") == "passed"
    reasons = [r for r in found.tags.get("gate_reasons", "").split("; ") if r]
    interrupted = found.tags.get(REGISTRATION_TAG) != "complete"
    champion_moved = False
    for alias, wanted in (("challenger", True), ("champion", passed)):
        if not wanted:
            continue
        try:
            holder = client.get_model_version_by_alias(name, alias)
        except MlflowException:
            holder = None
        if holder is None or (interrupted and int(holder.version) < int(version)):
            client.set_registered_model_alias(name, alias, version)
            champion_moved = champion_moved or alias == "champion"
    if interrupted:
        client.set_model_version_tag(name, version, REGISTRATION_TAG, "complete")
    return Registration(version, GateDecision(passed=passed, reasons=reasons), champion_moved)


REGISTRATION_TAG = "jf.registration"  # "complete" once a version's aliases were moved: a re-run then moves none


def register(
    client: MlflowClient, run_id: str, profile: Profile, report: dict, champion_at: Figures | None = None
) -> Registration:
    """Log the model as a Jacobi Forcing pyfunc, register a new version with its figures as tags, alias it
    `challenger`, and `champion` only when the gate passes. `champion_at`: the
    champion's figures on this round's evaluation (None: its recorded ones, when measured on the same evaluation).
    Every gate check is a tag on the version (`gate.<check>`) and a metric of the run (`gate_<check>`).
    Idempotent: a re-run of a round already registered (same `registration_key`) reuses that version and moves no
    alias."""
    name = profile.model_name
    key = registration_key(profile, report)
    found = _registered(client, name, key)
    if found is not None:
        reused = _reuse(client, name, found)
        client.set_tag(run_id, "jf.registered_version", reused.version)
        client.set_tag(run_id, "jf.registration_reused", "true")
        client.set_tag(run_id, "jf.gate", "passed" if reused.decision.passed else "failed")
        return reused
    figures = {k: Figures(**v) for k, v in report["figures"].items()}
    current, recorded = champion_figures(client, name, report["eval_key"])
    decision = decide(
        figures["candidate"],
        input_model=figures["input"],
        base_model=figures["lineage_base"],
        champion=None if current is None else (champion_at or recorded or UNMEASURED),
        cfg=profile.registry.gate,
    )
    _log_checks(client, run_id, decision.checks)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(run_id=run_id):
        info = log_model(report["model"], Path(tmp), fallback_decode=report["decode_config"])
    tags = {
        "round": Path(report["round_dir"]).name,
        # Two block sizes, named apart: the trajectories' n the model was trained at, and the n its decode config
        # (tuned, or the best measured) decodes with; a lone `n=16` beside a tuned n=64 read as a contradiction.
        "train_block_size": str(report["block_size"]),
        "decode_block_size": str(report["decode_config"]["block_size"]),
        "tpf": repr(float(report["headline_tpf"])),  # full precision: the gate compares against it
        "tps": f"{report['headline_tps']:.2f}",
        "speedup_vs_ar": f"{report['speedup_vs_ar']:.3f}",  # the headline: against our own AR, same model
        "identical_fraction": f"{report['identical_fraction']:.4f}",
        "dtype": report["dtype"],
        "accuracy": f"{report['accuracy']:.4f}",
        "base_model": report["model_in"],
        "lineage_base": report["lineage_base"],
        "gate": "passed" if decision.passed else "failed",
        "gate_reasons": "; ".join(decision.reasons),
        "jf.registration_key": key,
        "jf.figures": figures["candidate"].to_json(),  # what a later round's gate compares with
        **{f"gate.{c.name}": f"{'passed' if c.passed else 'failed'}: {c.reason}" for c in decision.checks},
    }
    serving = read_block(report["model"]) or {}
    if "crossover" in serving:  # where a server should switch to AR, and on what it was measured
        tags["ar_above_batch"] = str(serving.get("ar_above_batch"))
        tags["hardware"] = str(serving.get("hardware"))
    version = mlflow.register_model(info.model_uri, name, tags=tags).version
    client.set_registered_model_alias(name, "challenger", version)
    if decision.passed:
        client.set_registered_model_alias(name, "champion", version)
    client.set_model_version_tag(name, version, REGISTRATION_TAG, "complete")  # a killed run is finished by a re-run
    client.set_tag(run_id, "jf.registered_version", version)
    client.set_tag(run_id, "jf.gate", tags["gate"])
    return Registration(str(version), decision, decision.passed)


# A champion with no figures on this evaluation: the TPF check fails saying so (it never passes blind).
UNMEASURED = Figures(accuracy=float("nan"), tpf={}, headline_tpf=float("nan"), decode_key="", eval_key="unmeasured")


def _log_checks(client: MlflowClient, run_id: str, checks: list[Check]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"gate_{c.name}", float(c.value), now, 0) for c in checks if c.value is not None]
    metrics += [Metric(f"gate_{c.name}_passed", float(c.passed), now, 0) for c in checks]
    client.log_batch(run_id, metrics=metrics)


MODEL_CODE = Path(__file__).with_name("mlflow_model.py")  # models-from-code: stored with the model, not pickled
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "mlflow")  # what jf_core's decoding imports
EXAMPLE_PROMPT = "def fibonacci(n):"


def requirements() -> list[str]:
    """Pinned to what this environment runs (an index resolves them; a local build tag like +cpu is dropped)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in REQUIREMENTS]


def checkpoint_copy(model_dir: str | Path, dest: Path, fallback_decode: dict | None) -> Path:
    """The model directory as a plain HF checkpoint for the registry: weights, config (with its jacobi_forcing
    block), generation config and tokenizer; training summaries and tuning reports stay with the run."""
    from jf_core.decoding.config_io import saved_decode_config
    from jf_core.models import NOT_THE_MODEL
    from jf_core.serving.artifact import update_block

    src = Path(model_dir)
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in NOT_THE_MODEL and not f.name.startswith("."):
            shutil.copy2(f, dest / f.name)
    decode = saved_decode_config(src) or fallback_decode
    if decode is not None:
        update_block(dest, decode=decode)
    return dest


def log_model(model_dir: str | Path, tmp: Path, *, fallback_decode: dict | None = None, name: str = "model"):
    """Log a model directory to the active run as MLflow models-from-code: `tasks/mlflow_model.py` as the model's
    code, `jf_core` as its code path, the checkpoint as its artifact, a signature with params and an example."""
    from mlflow.models import infer_signature

    checkpoint = checkpoint_copy(model_dir, tmp / "checkpoint", fallback_decode)
    code = tmp / "code"
    shutil.copytree(
        Path(jf_core.__file__).resolve().parent,  # the installed library, wherever it lives (checkout or wheel)
        code / "jf_core",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    from jf_core.decoding.config_io import load_decode_config

    # The default budget is the one the model was tuned and evaluated with; 0 keeps the tuned block size.
    params = {
        "max_new_tokens": load_decode_config(checkpoint).max_new_tokens,
        "block_size": 0,
        "temperature": 0.0,  # greedy
        "top_p": 1.0,
        "top_k": 0,
        "seed": -1,  # random
    }
    signature = infer_signature([EXAMPLE_PROMPT], ["completion"], params=params)
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=str(MODEL_CODE),
        artifacts={"checkpoint": str(checkpoint)},
        code_paths=[str(code / "jf_core")],
        signature=signature,
        input_example=([EXAMPLE_PROMPT], {"max_new_tokens": 8, "block_size": 0}),
        pip_requirements=requirements(),
    )


def checkpoint_of(downloaded: Path) -> Path:
    """The HF checkpoint inside a downloaded registry model (its MLmodel names where the artifact lies)."""
    from mlflow.models import Model

    flavor = Model.load(str(downloaded / "MLmodel")).flavors.get("python_function", {})
    artifacts = flavor.get("artifacts") or {}
    entry = artifacts.get("checkpoint")
    if entry is None:
        raise ValueError(
            f"{downloaded}: the registered model has no `checkpoint` artifact (artifacts: {sorted(artifacts)}); "
            "it was registered by an older version of this project: register it again"
        )
    path = downloaded / entry["path"]
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: the registered model's checkpoint has no config.json")
    return path


def resolve_model(uri: str, profile: Profile | None = None) -> str:
    """A model as a local directory: `models:/<name>@<alias>` or `models:/<name>/<version>` are downloaded once per
    version (into $JF_HOME/models/registry, renamed into place when complete) from the profile's registry (without
    a profile: MLFLOW_TRACKING_URI, else the local store); anything else (a directory, a hub id, "embedded") goes
    through the profile."""
    if not uri.startswith("models:/"):
        if profile is None:
            return uri
        return profile.model.model_copy(update={"path": uri}).resolve(profile.compute.threads)
    store = tracking_uri(profile.registry if profile is not None else RegistryConfig())
    mlflow.set_tracking_uri(store)
    client = MlflowClient(store, store)
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        try:
            mv = client.get_model_version_by_alias(name, alias)
        except MlflowException as err:
            raise ValueError(f"model {uri}: registered model {name!r} has no alias {alias!r}") from err
    else:
        name, _, version = ref.partition("/")
        try:
            mv = client.get_model_version(name, version)
        except MlflowException as err:
            raise ValueError(f"model {uri}: registered model {name!r} has no version {version!r}") from err
    dest = jf_home() / "models" / "registry" / f"{name}-v{mv.version}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{mv.version}", dst_path=tmp))
            checkpoint_of(local)  # refuse a model without a checkpoint before it is put in place
            os.replace(local, dest)
    return str(checkpoint_of(dest))
