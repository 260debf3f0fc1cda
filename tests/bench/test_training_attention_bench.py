"""bench/training_attention.py: both forms timed at each shape and dtype, forward and backward, on the same inputs."""

from __future__ import annotations

import json
import sys

import torch


def test_each_shape_and_dtype_gets_both_forms_times_and_the_forms_agree(monkeypatch, tmp_path):
    from bench import training_attention as bench

    outputs: dict[str, list] = {"kernel": [], "eager": []}
    for name in bench.FORMS:
        form = bench.FORMS[name]
        monkeypatch.setitem(
            bench.FORMS, name, lambda *a, _f=form, _n=name: outputs[_n].append(_f(*a)) or outputs[_n][-1]
        )
    out = tmp_path / "rows.json"
    argv = ["bench", "--shapes", "3x7", "5x5", "--dtypes", "float32", "--repeats", "2", "--threads", "1",
            "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["queries"], r["keys"]) for r in rows] == [(3, 7), (5, 5)]
    for row in rows:
        for name in bench.FORMS:
            forward, backward, both = row[f"{name}_ms"]
            # `both` is the fastest call's forward and backward together: never under the fastest of each apart
            # (the three rounded to the microsecond).
            assert forward > 0 and backward > 0 and both >= forward + backward - 2e-3
    assert len(outputs["kernel"]) == len(outputs["eager"]) == 4  # 2 shapes x 2 repeats, taking turns
    for kernel, eager in zip(outputs["kernel"], outputs["eager"], strict=True):
        torch.testing.assert_close(eager, kernel, rtol=1e-5, atol=1e-5)
