"""The GPU check script keeps working where CI runs it: on the CPU, on tiny shapes (the figures are a GPU's job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_gpu_check_runs_in_smoke_mode(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_check.py"),
            "--device",
            "cpu",
            "--smoke",
            "--tune",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    # A failing section is recorded and the others run on (a GPU run keeps what it measured): none may fail here.
    assert not {k: v["error"] for k, v in data.items() if isinstance(v, dict) and "error" in v}
    # 3 architectures x 2 backends x 4 decoders (tests/jf_core/decoding/architectures.py)
    assert data["lossless"]["failures"] == [] and data["lossless"]["cases"] == 24
    assert set(data["numerics"]) == {"bf16", "bf16 + fp32 LM head", "fp32", "tps"}
    assert data["numerics"]["fp32"]["batch 8"]["identical_fraction"] == 1.0
    assert all(len(c["ms"]) == 3 for c in data["forward_cost"].values())
    # A random adapter drafts, the base verifies: every method's output is the base's greedy output, at each batch.
    adapter = data["adapter_speed"]
    # ...beside the untrained decoders a user would pick instead (HF's prompt lookup at batch 1, the base's Jacobi
    # with prompt lookup) and AR timed twice (the control row: the timer's spread).
    # With --tune, each model's config tuned on a question never timed, as a round's evaluation reports them.
    ours = {"hf_generate", "ar", "ar_control", "jacobi_n4", "jacobi_n8", "lookup_n8", "base_lookup_n8"}
    ours |= {"tuned", "base_tuned"}
    assert set(adapter["tuned"]) == {"adapter model", "base"} and "span=" not in adapter["tuned"]["base"]
    assert set(adapter["batch 1"]) == ours | {"hf_prompt_lookup"} and set(adapter["batch 4"]) == ours
    assert all(r["identical_to_base"] == 1.0 for b in ("batch 1", "batch 4") for r in adapter[b].values())
    assert 0 < adapter["step_breakdown"]["jacobi, n=8, batch 1"]["forward_share"] <= 1
    assert "Lossless" in (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_runs_only_the_sections_asked_for(tmp_path):
    """`--only`: a lease too short for the whole check runs what is left of it; an unknown section is refused."""
    script = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--smoke"]
    script += ["--out", str(tmp_path)]
    out = subprocess.run([*script, "--only", "forward_cost"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "forward_cost" in data and not {"lossless", "numerics", "flash", "flex_training", "adapter_speed"} & set(
        data
    )
    assert "Forward cost" in (tmp_path / "gpu_check.md").read_text()
    bad = subprocess.run([*script, "--only", "forward_cost,speed"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--only: no section speed" in bad.stderr
