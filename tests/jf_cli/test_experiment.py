"""`jf experiment` (jf_cli/experiment.py) as a user reaches it: an earlier run's rows plotted and fitted without a run,
through the command and through bench/mechanism.py (the same command, the SmolLM2 profile its default); a run
without variants refused by name. The run itself is tests/jf_core/experiments/test_run.py's."""

from __future__ import annotations

import json

import pytest

from jf_cli.main import main as jf


def _rows(path):
    history = [{"step": float(s), "loss": 1.0, "probe_tpf_n16": 1.0 + 0.1 * s} for s in range(4)]
    path.write_text(json.dumps({"variant": "v", "train_tokens": 4000, "history": history}) + "\n")
    return path


def test_an_earlier_runs_rows_are_fitted_and_plotted_without_a_run(tmp_path, capsys):
    from bench.mechanism import main as mechanism

    rows = _rows(tmp_path / "rows.jsonl")
    assert jf(["experiment", "--from-json", str(rows), "--plot", str(tmp_path / "a.png")]) == 0
    assert "| v | n16 | log10 |" in capsys.readouterr().out and (tmp_path / "a.png").is_file()
    assert mechanism(["--from-json", str(rows), "--plot", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").is_file()


def test_a_run_names_what_it_lacks(capsys):
    with pytest.raises(SystemExit) as exit_:
        jf(["experiment", "--out", "x.jsonl"])
    assert exit_.value.code == 2 and "--variant and --out are required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ("c-1:{}", "'c-1': a name of letters"),
        ('c1:{"chain": 1}', "--layout c1: "),
        ("c1:[1]", "expected a JSON object"),
    ],
)
def test_a_layout_it_cannot_decode_is_refused_by_name_before_any_work(layout, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        jf(["experiment", "--variant", "v:{}", "--out", "x.jsonl", "--layout", layout])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
