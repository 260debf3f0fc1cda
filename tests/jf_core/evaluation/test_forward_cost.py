from __future__ import annotations

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
