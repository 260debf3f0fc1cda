"""A model directory as a registered MLflow model and back: logged as models-from-code (`tasks/mlflow_model.py`
with `jf_core` as its code path and the checkpoint as its artifact), and `models:/<name>@<alias>` resolved to a
local checkpoint for every command that takes a model."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

import jf_core
from jacobi_forcing.tasks.mlflow_runs import tracking_uri
from jf_core import model_ref
from jf_core.config import Profile, RegistryConfig
from jf_core.model_dir import registry_copy
from jf_core.paths import jf_home

MODEL_CODE = Path(__file__).with_name("mlflow_model.py")  # models-from-code: stored with the model, not pickled
if TYPE_CHECKING:
    from jf_core.decoding import JacobiConfig

REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "mlflow")  # what jf_core's decoding imports
EXAMPLE_PROMPT = "def fibonacci(n):"


@contextlib.contextmanager
def environment(**settings: str) -> Iterator[None]:
    """Environment variables set for the block and put back as they were after it."""
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def requirements() -> list[str]:
    """Pinned to what this environment runs (an index resolves them; a local build tag like +cpu is dropped)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in REQUIREMENTS]


def log_model(model_dir: str | Path, tmp: Path, *, fallback_decode: JacobiConfig | None = None, name: str = "model"):
    """Log a model directory to the active run as MLflow models-from-code: `tasks/mlflow_model.py` as the model's
    code, `jf_core` as its code path, the checkpoint as its artifact, a signature with params and an example."""
    from mlflow.models import infer_signature

    checkpoint = registry_copy(model_dir, tmp / "checkpoint", fallback_decode)
    code = tmp / "code"
    shutil.copytree(
        Path(jf_core.__file__).resolve().parent,  # the installed library, wherever it lives (checkout or wheel)
        code / "jf_core",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    from jf_core.decoding import load_decode_config

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
    # Validating the input example copies the logged artifacts back: nine progress bars of a local copy in the
    # round's log. Off for this call only: a client downloading a registered model keeps its bar.
    with environment(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false"):
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
    """Every model reference as a local directory or hub id (`jf_core.model_ref.resolve_model`, with MLflow's
    registry for `models:/`): the door every command option, flow parameter and server takes. The profile gives
    the registry (without one: MLFLOW_TRACKING_URI, else the local store)."""
    return model_ref.resolve_model(uri, registry=lambda ref: registered_checkpoint(ref, profile))


def registered_checkpoint(uri: str, profile: Profile | None = None) -> str:
    """`models:/<name>@<alias>` or `models:/<name>/<version>` as a local checkpoint, downloaded once per version
    (into $JF_HOME/models/registry, renamed into place when complete) from the profile's registry."""
    store = tracking_uri(profile.registry if profile is not None else RegistryConfig())
    if store.startswith("sqlite:///") and not Path(store.removeprefix("sqlite:///")).is_file():
        # MLflow would create an empty store there and answer that the model does not exist: a wrong URI (or no
        # round run yet) reads as a missing model. Said for what it is, and nothing is created.
        raise ValueError(
            f"model {uri}: there is no MLflow store at {store} (MLFLOW_TRACKING_URI, else the profile's "
            "registry.tracking_uri); `jf run` ends by printing the URI of the store it registered in"
        )
    mlflow.set_tracking_uri(store)
    client = MlflowClient(store, store)
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        try:
            mv = client.get_model_version_by_alias(name, alias)
        except MlflowException as err:
            raise ValueError(
                f"model {uri}: registered model {name!r} has no alias {alias!r} in the registry at {store} "
                "(MLFLOW_TRACKING_URI, else the profile's registry.tracking_uri)"
            ) from err
    else:
        name, _, version = ref.partition("/")
        try:
            mv = client.get_model_version(name, version)
        except MlflowException as err:
            raise ValueError(
                f"model {uri}: registered model {name!r} has no version {version!r} in the registry at {store} "
                "(MLFLOW_TRACKING_URI, else the profile's registry.tracking_uri)"
            ) from err
    dest = jf_home() / "models" / "registry" / f"{name}-v{mv.version}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{mv.version}", dst_path=tmp))
            checkpoint_of(local)  # refuse a model without a checkpoint before it is put in place
            os.replace(local, dest)
    return str(checkpoint_of(dest))
