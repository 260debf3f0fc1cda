from __future__ import annotations

import copy

import pytest
import torch

from jf_cli.main import main
from jf_core.evaluation.forward_cost import window_cost


def test_window_cost_measures_each_width_over_the_same_context(tiny_model, monkeypatch):
    """Every width is timed over the same `context` tokens: the cache is cropped back after each forward (the
    widths take turns, so one that kept its tokens would lengthen the others' context)."""
    from transformers import DynamicCache

    lengths = []
    crop = DynamicCache.crop

    def spy(self, max_length):
        crop(self, max_length)
        lengths.append(self.get_seq_length())

    monkeypatch.setattr(DynamicCache, "crop", spy)
    cost = window_cost(tiny_model, [1, 8, 16], context=24, repeats=2, warmup=1)
    assert set(cost["ms"]) == {1, 8, 16} and all(ms > 0 for ms in cost["ms"].values())
    assert cost["ratio_to_width_1"][1] == 1.0
    assert lengths == [24] * 9  # (warmup + repeats) x widths
    assert cost["threads"] == torch.get_num_threads()


def test_jf_bench_forward_prints_the_break_even_table(embedded, capsys):
    model, _ = embedded
    assert main(["bench", "forward", "--model", model.name_or_path, "--widths", "1", "4", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "| width | ms per forward | x width 1 (break-even TPF) |" in out and "| 4 |" in out


def test_with_a_gate_each_width_is_also_timed_with_the_adapter_acting(tiny_model, monkeypatch):
    """`gated_slots`: the same widths with the adapter acting on the last k slots (never slot 0), each forward in
    both forms; a model without an adapter is refused by name."""
    from jf_core.draft_adapter import adapter as draft
    from jf_core.draft_adapter.config import DraftLora

    with pytest.raises(ValueError, match="gated_slots=2: the model has no draft adapter"):
        window_cost(tiny_model, [4], context=8, repeats=1, warmup=0, gated_slots=2)
    model = copy.deepcopy(tiny_model)
    draft.attach_draft_adapter(model, DraftLora(rank=2))
    gates = []
    real = draft.gated

    def spy(m, gate):
        gates.append(None if gate is None else gate.tolist())
        return real(m, gate)

    monkeypatch.setattr("jf_core.evaluation.forward_cost.gated", spy)
    cost = window_cost(model, [1, 4], context=8, repeats=2, warmup=0, gated_slots=2)
    assert set(cost["gated_ms"]) == {1, 4} and cost["gated_slots"] == 2
    assert gates.count(None) == 4  # 2 reps x 2 widths, ungated
    acting = [g for g in gates if g is not None]
    assert acting.count([[0.0, 0.0, 1.0, 1.0]]) == 2  # width 4: its last 2 slots
    assert acting.count([[0.0]]) == 2  # width 1: slot 0 only, which the adapter never computes


def test_jf_bench_forward_gated_refuses_a_model_without_an_adapter(embedded):
    model, _ = embedded
    with pytest.raises(SystemExit, match="--gated: gated_slots=3: the model has no draft adapter"):
        main(["bench", "forward", "--model", model.name_or_path, "--widths", "1", "--repeats", "1", "--gated", "3"])


def test_a_stalled_first_width_never_prints_a_measured_ratio_as_zero():
    """A busy machine stalled one width-1 forward for 600 ms (CI, 2026-12-04): the ratios to it are 0.003, which the
    table must print as a small number, not as 0.00 (a figure that reads as missing)."""
    from jf_core.evaluation.forward_cost import forms_table

    ms = {"MKL": {1: [0.7, 600.0], 4: [0.8, 0.8]}, "packed": {1: [1.1, 1.2], 4: [1.4, 1.3]}}
    head, rows = forms_table(ms, ("MKL", "packed", "packed speedup"))
    assert head[1:3] == ["MKL ms", "packed ms"]
    width_4 = rows[1]
    assert width_4[4] == "0.0027"  # 0.8 / 300.35, to two significant figures
    assert all(float(c) > 0 for row in rows for c in row[1:6])
    assert rows[0][1] == "300.4" and rows[0][3] == "261.17"  # above the places' reach, still to 2 places
