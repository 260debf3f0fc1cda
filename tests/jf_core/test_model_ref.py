"""One function resolves every model reference; the registry form is refused, with the door to use, where MLflow is
not plugged in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jf_core.model_ref import resolve_model
from jf_core.toy.bootstrap import SHIPPED_DIR


def test_embedded_is_the_shipped_model_copied_into_the_home_once(tmp_path, monkeypatch):
    """Every machine starts from the same base: `embedded` is the package's weights, byte for byte, whatever the
    profile's thread count; the copy is made once and the package's own files are never handed out to be written."""
    monkeypatch.setenv("JF_HOME", str(tmp_path))
    path = Path(resolve_model("embedded"))
    assert path.parent == tmp_path / "models" and path != SHIPPED_DIR
    shipped = (SHIPPED_DIR / "model.safetensors").read_bytes()
    assert (path / "model.safetensors").read_bytes() == shipped
    assert json.loads((path / "bootstrap.json").read_text())["accuracy"] == 1.0
    (path / "config.json").write_text("{}")  # a command writing into the copy (`jf tune` updates its config)
    assert resolve_model("embedded") == str(path) and (path / "config.json").read_text() == "{}"  # copied once
    assert json.loads((SHIPPED_DIR / "config.json").read_text())["model_type"] == "qwen2"
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".") and p.is_dir()] == []  # no temporary


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
    names = "embedded_model|ensure_embedded_model|ensure_package_model|registered_checkpoint"
    doors = re.compile(rf"(?<!def )\b({names})\(")
    allowed = {"jf_core/model_ref.py", "tasks/model_package.py", "flows/bootstrap.py"}
    found = {
        str(path.relative_to(root))
        for folder in ("jf_core", "jf_cli", "tasks", "flows", "infra", "bench", "jf_vllm")
        for path in (root / folder).rglob("*.py")
        if doors.search(path.read_text())
    }
    assert found - allowed == set() and found >= {"jf_core/model_ref.py", "tasks/model_package.py"}
