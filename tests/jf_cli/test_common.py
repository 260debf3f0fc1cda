"""Every command's model reference (`jf_cli.common.model_path`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_local_model_needs_no_mlflow_and_a_registered_one_goes_to_the_registry(tmp_path):
    """A lent GPU's image has no MLflow (2026-12-04: `jf experiment` on a GGUF file died importing it there): a
    directory or a hub id resolves without it, and only `models:/` reaches for the registry."""
    probe = f"""
import sys
sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, as on a machine without it
from jf_cli.common import model_path
print(model_path({str(tmp_path)!r}), model_path("HuggingFaceTB/SmolLM2-135M-Instruct"))
try:
    model_path("models:/jf-tiny@champion")
except ImportError as err:
    print("registry:", err)
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()
    assert first == f"{tmp_path} HuggingFaceTB/SmolLM2-135M-Instruct"
    assert second.startswith("registry:") and "mlflow" in second
