"""A round's report as a type: derived figures come from its two evaluations, it reads back from report.json as
written, and its MLflow metrics and summary carry the headline."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from jf_core.decoding import config_from_dict
from jf_core.round.report import RoundReport
from tests.reports import evaluation, round_report

TPS = {"ar": 500.0, "jacobi_n16": 900.0, "jacobi_n32": 1000.0}
CONFIG = {"block_size": 32, "num_blocks": 2, "pool_size": 4, "seed_drafts": False}


def _report():
    jf = evaluation({16: 3.35, 32: 4.16}, TPS, accuracy=0.99, tuned={"tpf": 5.0, "tps": 1250.0, "config": CONFIG})
    return round_report(jf, evaluation({16: 1.36, 32: 1.44}, {"ar": 500.0, "jacobi_n16": 600.0, "jacobi_n32": 620.0}))


def test_the_headline_is_the_tuned_row_and_the_block_sizes_are_plain_jacobi():
    report = _report()
    assert report.headline is report.eval.methods["tuned"] and report.tuned is report.headline
    assert report.tpf == {"16": 3.35, "32": 4.16} and report.base_tpf == {"16": 1.36, "32": 1.44}
    assert report.accuracy == 0.99 and report.base_accuracy == 1.0


def test_metrics_are_the_headline_the_tuned_row_and_every_block_size():
    m = _report().metrics()
    assert m["tpf"] == 5.0 and m["tps"] == 1250.0 and m["speedup_vs_ar"] == 2.5 and m["tuned_tpf"] == 5.0
    assert m["accuracy_drop"] == pytest.approx(0.01)
    assert m["tpf_n32"] == 4.16 and m["base_tpf_n16"] == 1.36 and m["tps_ar"] == 500.0 and m["tps_jacobi_n16"] == 900.0
    assert m["output_repetition"] == 0.0 and m["train_seconds"] == 464.0
    assert all(isinstance(v, float) for v in m.values())


def test_the_summary_is_plain_json_with_the_headline():
    from jf_core.round.report import RoundSummary

    summary = _report().summary()
    assert RoundSummary.model_validate_json(summary.model_dump_json()) == summary  # what a flow run's result holds
    assert (
        summary.headline_tpf == 5.0 and summary.decode_config == config_from_dict(CONFIG) and summary.tpf["32"] == 4.16
    )


def test_report_json_reads_back_as_written_and_refuses_another_shape(tmp_path):
    report = _report()
    report.save(tmp_path / "report.json")
    again = RoundReport.load(tmp_path / "report.json")
    assert again.model_dump_json() == report.model_dump_json()
    assert again.figures.candidate.headline_tpf == 5.0  # the gate's figures come back as Figures
    data = json.loads((tmp_path / "report.json").read_text())
    del data["eval"]["methods"]["ar"]["tps"]
    with pytest.raises(ValidationError, match=r"eval\.methods\.ar\.tps"):
        RoundReport.model_validate(data)


def test_the_stage_times_say_where_the_rounds_time_went_and_trainings_share():
    from jf_core.round.report import stage_times
    from jf_core.round.results import PackResult

    report = _report()  # trajectories 4 s, no pack time, training 464 s, two evaluations of 1 s, no tune
    assert report.stage_seconds == {
        "trajectories": 4.0, "pack": 0.0, "train": 464.0, "evaluate_input": 1.0, "evaluate": 1.0,
    }  # fmt: skip
    read = report.model_copy(update={"base_eval": report.base_eval.model_copy(update={"eval_seconds": 0.0})})
    assert "evaluate_input" not in read.stage_seconds  # read from the trained model's evaluation: no time of its own
    packing = PackResult.model_validate({**report.packing.model_dump(), "seconds": 30.0})
    timed = report.model_copy(update={"packing": packing})
    assert timed.stage_seconds["pack"] == 30.0 and timed.metrics()["stage_seconds_pack"] == 30.0
    assert timed.summary().stage_seconds == timed.stage_seconds
    line = stage_times({"trajectories": 60.0, "train": 240.0, "evaluate": 300.0})
    assert line == "minutes per stage: trajectories 1.0, train 4.0 (40%), evaluate 5.0; 10.0 in all"
    assert stage_times({}) == "time per stage: not recorded"
