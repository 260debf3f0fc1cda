"""The round's metrics table and summary, and Prefect artifact keys."""

from __future__ import annotations

from jacobi_forcing.tasks.reporting import artifact_key, summary_markdown
from jf_core.evaluation.results import Evaluation
from jf_core.round.results import Registration
from tests.reports import evaluation, round_report

TPS = {"ar": 500.0, "jacobi_n16": 900.0, "jacobi_n32": 1000.0}
REPORT = round_report(
    evaluation({16: 3.35, 32: 4.16}, TPS, accuracy=0.995),
    evaluation({16: 1.36, 32: 1.44}, {"ar": 500.0, "jacobi_n16": 600.0, "jacobi_n32": 620.0}),
)


def test_rows_per_block_size_with_speedup():
    rows = REPORT.metrics_rows()
    assert [r["block size n"] for r in rows] == [16, 32]
    assert rows[1]["speedup vs AR"] == 2.0 and rows[0]["base TPF"] == 1.36
    assert rows[0]["JF TPF"] == 3.35 and rows[0]["JF TPS"] == 900.0


def test_the_tuned_config_gets_its_own_row():
    config = {"block_size": 64, "num_blocks": 2, "pool_size": 0, "seed_drafts": True}
    jf = evaluation({16: 3.35, 32: 4.16}, TPS, tuned={"tpf": 7.8, "tps": 1500.0, "config": config})
    rows = round_report(jf, REPORT.base_eval).metrics_rows()
    assert rows[-1]["block size n"] == "tuned n=64 K=2 pool=0 seeded"
    assert rows[-1]["JF TPF"] == 7.8 and rows[-1]["speedup vs AR"] == 3.0


def test_the_untrained_anchors_and_the_control_close_the_table_and_the_summary_states_them():
    """What the trained model is held to, from its own run: the input model's untrained decoding (its TPF in the
    base column) and AR against AR in this run."""
    anchors = {"hf_prompt_lookup": (1.6, 700.0), "tuned": (1.5, 800.0)}
    jf = evaluation({16: 3.35, 32: 4.16}, TPS, untrained=anchors, control_tps=510.0)
    report = round_report(jf, REPORT.base_eval)
    rows = report.metrics_rows()
    assert [r["block size n"] for r in rows[2:]] == [
        "untrained base_hf_prompt_lookup",
        "untrained base_tuned",
        "control: our AR again",
    ]
    assert rows[3]["base TPF"] == 1.5 and rows[3]["speedup vs AR"] == 1.6 and rows[3]["JF TPS"] == ""
    assert rows[4]["speedup vs AR"] == 1.02 and rows[4]["JF TPF"] == 1.0
    md = summary_markdown(report, None, None)
    # The headline (plain Jacobi at n = 32: 1000 tokens/s) over the faster anchor's 800.
    assert "1.25x the best untrained decoding of the input model (base_tuned); timing spread" in md
    assert "(AR against AR in this run) 0.020" in md
    assert "no untrained anchor in this run" in summary_markdown(REPORT, None, None)


def test_the_summary_says_when_the_tune_left_the_models_draft_adapter_out():
    """A round's model keeps a draft adapter and the round's corpus; where its tuned config decodes without the
    adapter, the speed is the corpus's, and the summary says so rather than let it read as training's."""
    config = {"block_size": 16, "num_blocks": 1, "pool_size": 0, "suffix": 16, "adapter": False}
    tuned = {"tpf": 2.5, "tps": 1200.0, "config": config}
    fields = evaluation({16: 1.7}, {"ar": 500.0, "jacobi_n16": 600.0}, tuned=tuned).model_dump()
    left_out = Evaluation.model_validate({**fields, "draft_adapter": True})
    md = summary_markdown(round_report(left_out, REPORT.base_eval), None, None)
    assert (
        "The tuned config leaves the draft adapter out (on this grid and machine decoding without it was faster)" in md
    )
    kept = Evaluation.model_validate({**fields, "draft_adapter": True, "decode_config": {**config, "adapter": True}})
    plain = Evaluation.model_validate(fields)
    for other in (kept, plain):
        assert "draft adapter" not in summary_markdown(round_report(other, REPORT.base_eval), None, None)


def test_the_table_names_the_method_that_trained_the_model():
    """The tiny profile trains with CLLM's objective: its table says so, as the round's log does."""
    rows = REPORT.model_copy(update={"training": {"method": "cllm"}}).metrics_rows()
    assert rows[0]["CLLM TPF"] == 3.35 and "JF TPF" not in rows[0]


def test_summary_states_the_gate_and_links_mlflow():
    reg = Registration(
        model_name="jf-tiny", version="3", gate_passed=False, gate_reasons=["TPF 4.160 below 5"], champion_moved=False
    )
    md = summary_markdown(REPORT, reg, "http://127.0.0.1:5000/#/experiments/1/runs/abc")
    assert "version 3" in md and "champion` unchanged" in md and "TPF 4.160 below 5" in md
    assert "[MLflow run](http://127.0.0.1:5000/#/experiments/1/runs/abc)" in md
    assert "Minutes per stage: trajectories 0.1, pack 0.0, train 7.7 (99%), " in md  # where the round's time went


def test_summary_tables_every_gate_check():
    checks = [
        {"name": "accuracy_vs_base", "passed": False, "value": 0.07, "reason": "accuracy dropped 0.0700 (> 0.05)"},
        {"name": "repetition", "passed": True, "value": 0.0, "reason": "repeated n-grams 0.010 vs 0.010"},
    ]
    reg = Registration.model_validate(
        {"model_name": "jf-tiny", "version": "4", "gate_passed": False, "gate_reasons": [], "gate_checks": checks}
        | {"champion_moved": False}
    )
    md = summary_markdown(REPORT, reg, None)
    assert "| accuracy_vs_base | **failed** | accuracy dropped 0.0700 (> 0.05) |" in md
    assert "| repetition | passed | repeated n-grams 0.010 vs 0.010 |" in md


def test_artifact_keys_are_lowercase_dashes():
    assert artifact_key("jf-round", "Qwen2.5-Coder_7B", "n32") == "jf-round-qwen2-5-coder-7b-n32"
