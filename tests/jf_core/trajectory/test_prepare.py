"""`jf prompts prepare`: a dataset becomes a prompt store (filtered by token length, exact duplicates dropped, a
stable calibration split held out, counts recorded) that a profile reads as its prompt source."""

from __future__ import annotations

import json

import pytest

from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prepare import prepare_prompts
from jf_core.trajectory.prompts import PromptSourceConfig, calibration_prompts, load_prompts


@pytest.fixture()
def dataset(tmp_path):
    rows = [{"input": e.prompt, "row": i} for i, e in enumerate(make_split("train", 60))]
    rows += [dict(rows[3]), dict(rows[7])]  # two exact duplicates
    rows += [{"input": "   "}, {"other": "no input"}, {"input": "a=1; " * 60}]  # empty, missing, too long
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepare_filters_deduplicates_and_holds_out_a_stable_calibration_split(dataset, tmp_path):
    tok = build_tokenizer()
    source = PromptSourceConfig(source=str(dataset), text_field="input", max_prompt_tokens=40)
    report = prepare_prompts(source, tok, tmp_path / "store", calibration=10)
    assert report.rows_read == 65 and (report.train, report.calibration) == (50, 10)
    assert report.skipped == {"duplicate": 2, "empty": 1, "missing_field:input": 1, "too_long": 1}
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["train"] == 50 and manifest["skipped"]["duplicate"] == 2
    store = PromptSourceConfig(source=str(tmp_path / "store"), text_field="input", id_field="id")
    train = {p.prompt_id for p in load_prompts(store, tok).items}
    calib = {p.prompt_id for p in load_prompts(store.model_copy(update={"split": "calib"}), tok).items}
    assert len(train) == 50 and len(calib) == 10 and not train & calib
    assert len(calibration_prompts(store, tok, 4, "calib")) == 4
    again = prepare_prompts(source, tok, tmp_path / "again", calibration=10)  # a re-run holds out the same prompts
    assert (tmp_path / "again" / "calib.jsonl").read_text() == (tmp_path / "store" / "calib.jsonl").read_text()
    assert again.train == 50


def test_too_few_prompts_for_the_calibration_split_is_an_error_naming_the_counts(dataset, tmp_path):
    source = PromptSourceConfig(source=str(dataset), text_field="input", max_prompt_tokens=40)
    with pytest.raises(ValueError, match="60 usable prompts, not enough to hold out 100"):
        prepare_prompts(source, build_tokenizer(), tmp_path / "store", calibration=100)
    assert not (tmp_path / "store").exists()


def test_the_cli_writes_the_store_a_profile_names(dataset, tmp_path, capsys):
    from jf_cli.main import main

    tok_dir = tmp_path / "tok"
    build_tokenizer().save_pretrained(tok_dir)
    argv = ["prompts", "prepare", "--source", str(dataset), "--text-field", "input", "--max-prompt-tokens", "40"]
    assert main([*argv, "--calibration", "5", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "55 training and 5 calibration prompts" in out and "evaluation.calibration_split=calib" in out
