"""One function resolves every model reference; the registry form is refused, with the door to use, where MLflow is
not plugged in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jf_core.model_ref import resolve_model
from jf_core.toy.bootstrap import BootstrapConfig, embedded_model_dir


def test_the_profile_thread_count_picks_the_embedded_model_it_trains(tmp_path, monkeypatch):
    """`jf run --set compute.threads=1` resolves (and would bootstrap) the 1-thread embedded model."""
    monkeypatch.setenv("JF_HOME", str(tmp_path))
    one = embedded_model_dir(BootstrapConfig(threads=1))
    one.mkdir(parents=True)
    (one / "bootstrap.json").write_text(json.dumps({"threads": {"policy": "fixed", "initial": 1}}))
    assert resolve_model("embedded", threads=1) == str(one)
    assert embedded_model_dir(BootstrapConfig(threads=2)) != one


def test_a_directory_or_hub_id_is_itself_and_a_registered_model_goes_through_the_registry(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match=r"models:/jf-tiny@champion: a registered model is read from MLflow"):
        resolve_model("models:/jf-tiny@champion")
    asked = []
    assert resolve_model("models:/jf-tiny/3", registry=lambda ref: asked.append(ref) or "/checkpoint") == "/checkpoint"
    assert asked == ["models:/jf-tiny/3"]


def test_no_other_code_resolves_a_model_reference_itself():
    """Every command option, flow parameter, profile and server goes through the one function: nothing else
    bootstraps the embedded model, imports a package's GGUF or downloads a registered model on its own (the
    `jf-bootstrap` flow, whose job is the bootstrap, aside)."""
    root = Path(__file__).resolve().parents[2]
    doors = re.compile(r"(?<!def )\b(ensure_embedded_model|ensure_package_model|registered_checkpoint)\(")
    allowed = {"jf_core/model_ref.py", "tasks/model_package.py", "flows/bootstrap.py"}
    found = {
        str(path.relative_to(root))
        for folder in ("jf_core", "jf_cli", "tasks", "flows", "infra", "bench", "jf_vllm")
        for path in (root / folder).rglob("*.py")
        if doors.search(path.read_text())
    }
    assert found - allowed == set() and found >= {"jf_core/model_ref.py", "tasks/model_package.py"}
