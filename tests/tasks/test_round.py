"""`run_round` end to end on a tiny random model: trajectories (real Ray) -> pack -> train -> evaluate -> report;
a second call returns the finished round instead of redoing it."""

from __future__ import annotations

import json

import pytest

from jf_core.config import EvalConfig, JFTrainConfig
from tasks.round import run_round

pytestmark = pytest.mark.timeout(600)


def test_round_writes_a_report_and_is_not_redone(ray_local, profile, tmp_path):
    p = profile.model_copy(
        update={
            "training": JFTrainConfig(steps=3, batch_size=4, warmup_steps=1),
            "evaluation": EvalConfig(
                num_prompts=6, speed_prompts=2, block_sizes=[4, 8], max_new_tokens=24, batch_size=3
            ),
        }
    )
    report = run_round(p, tmp_path / "r", progress=False)
    for key in ("base_accuracy", "accuracy", "tpf", "speedup_vs_ar", "train_seconds"):
        assert key in report
    assert set(report["tpf"]) == {"4", "8"} and all(v >= 1.0 for v in report["tpf"].values())
    assert report["packing"]["examples"] == 22 and report["loss_curve"][-1]["step"] == 2.0
    assert (tmp_path / "r" / "model" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "r" / "report.json").read_text())["tpf"] == report["tpf"]
    again = run_round(p, tmp_path / "r", progress=False)
    assert again == json.loads((tmp_path / "r" / "report.json").read_text())


def test_round_evaluation_runs_any_benchmark(profile, tmp_path):
    """The round's evaluation on a GSM8K-format file (a real profile's path), AR and Jacobi side by side."""
    from tasks.stages import evaluate_model

    rows = [
        {"question": f"What is {i} + 1?", "answer": f"{i}+1=<<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"} for i in range(5)
    ]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = profile.model_copy(
        update={
            "evaluation": EvalConfig(
                benchmark="gsm8k",
                source=str(tmp_path / "gsm8k.jsonl"),
                template="Q: {question} A:",
                num_prompts=4,
                speed_prompts=2,
                block_sizes=[4],
                max_new_tokens=12,
                batch_size=2,
            )
        }
    )
    result = evaluate_model(p.model.path, p)
    assert 0.0 <= result["accuracy"] <= 1.0 and set(result["tpf"]) == {"4"} and result["tps"]["ar"] > 0
    assert result["decode_config"]["block_size"] == 4
