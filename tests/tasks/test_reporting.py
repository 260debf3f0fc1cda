"""The round's metrics table and summary, and Prefect artifact keys."""

from __future__ import annotations

from jacobi_forcing.tasks.reporting import artifact_key, metrics_rows, summary_markdown

REPORT = {
    "profile": "tiny",
    "block_size": 16,
    "accuracy": 0.995,
    "base_accuracy": 1.0,
    "tpf": {"16": 3.35, "32": 4.16},
    "base_tpf": {"16": 1.36, "32": 1.44},
    "tps": {"ar": 500.0, "jacobi_n16": 900.0, "jacobi_n32": 1000.0},
    "headline_tpf": 4.16,
    "speedup_vs_ar": 2.0,
    "speedup_block_size": 32,
    "train_seconds": 464.0,
    "model_in": "/m/in",
    "model": "/m/out",
}


def test_rows_per_block_size_with_speedup():
    rows = metrics_rows(REPORT)
    assert [r["block size n"] for r in rows] == [16, 32]
    assert rows[1]["speedup vs AR"] == 2.0 and rows[0]["base TPF"] == 1.36
    assert rows[0]["JF TPF"] == 3.35


def test_the_table_names_the_method_that_trained_the_model():
    """The tiny profile trains with CLLM's objective: its table says so, as the round's log does."""
    rows = metrics_rows({**REPORT, "training": {"method": "cllm"}})
    assert rows[0]["CLLM TPF"] == 3.35 and "JF TPF" not in rows[0]


def test_summary_states_the_gate_and_links_mlflow():
    reg = {"model_name": "jf-tiny", "version": "3", "gate_passed": False, "gate_reasons": ["TPF 4.160 below 5"]}
    md = summary_markdown(REPORT, reg, "http://127.0.0.1:5000/#/experiments/1/runs/abc")
    assert "version 3" in md and "champion` unchanged" in md and "TPF 4.160 below 5" in md
    assert "[MLflow run](http://127.0.0.1:5000/#/experiments/1/runs/abc)" in md


def test_summary_tables_every_gate_check():
    checks = [
        {"name": "accuracy_vs_base", "passed": False, "value": 0.07, "reason": "accuracy dropped 0.0700 (> 0.05)"},
        {"name": "repetition", "passed": True, "value": 0.0, "reason": "repeated n-grams 0.010 vs 0.010"},
    ]
    reg = {"model_name": "jf-tiny", "version": "4", "gate_passed": False, "gate_reasons": [], "gate_checks": checks}
    md = summary_markdown(REPORT, reg, None)
    assert "| accuracy_vs_base | **failed** | accuracy dropped 0.0700 (> 0.05) |" in md
    assert "| repetition | passed | repeated n-grams 0.010 vs 0.010 |" in md


def test_artifact_keys_are_lowercase_dashes():
    assert artifact_key("jf-round", "Qwen2.5-Coder_7B", "n32") == "jf-round-qwen2-5-coder-7b-n32"
