"""The low-rank delta's two forms (jf_core/layers/lora.py): after a layer's output and fused into its packed product,
both `output + w * (x A^T) B^T` with a weight per token (0 where the adapter does not act)."""

from __future__ import annotations

import pytest
import torch

from jf_core.layers import packed
from jf_core.layers.lora import BlockDiagonal, add_delta, fused_delta, single_run
from jf_core.layers.packed import PackedWeight


def _parts(rows: int):
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 80, bias=False)
    x = torch.randn(2, rows, 48)
    a, b = torch.randn(4, 48), torch.randn(80, 4)
    weights = torch.tensor([[1.0] * rows, [0.0] + [0.5] * (rows - 1)])[..., None]
    want = layer(x) + weights * ((x @ a.T) @ b.T)
    return layer, x, a, b, weights, want


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_delta_after_a_layers_output_is_the_formula(rows):
    layer, x, a, b, weights, want = _parts(rows)
    with torch.no_grad():
        got = add_delta(layer(x), x, a, b, weights)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[1, 0], layer(x)[1, 0].detach())  # weight 0: the layer's own output, exactly


@pytest.mark.skipif(not packed.AVAILABLE, reason="oneDNN's packed ops are pinned to another torch here")
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("kept_b", [False, True], ids=["b-as-given", "b-kept-transposed"])
def test_the_delta_fused_into_the_packed_product_is_the_formula(rows, kept_b):
    layer, x, a, b, weights, want = _parts(rows)
    store, right = PackedWeight(), (BlockDiagonal() if kept_b else None)
    with torch.no_grad():
        got = fused_delta(store, layer, x, a, b, weights, right)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)  # packed: fp32 rounding, not bit for bit
        a.mul_(2.0)  # a weight written in place (an optimizer step) is packed again, not served stale
        b.mul_(-1.0)  # and a B is transposed again
        twice = fused_delta(store, layer, x, a, b, weights, right)
    torch.testing.assert_close(twice, layer(x).detach() + weights * ((x @ a.T) @ b.T), rtol=1e-5, atol=1e-4)


def test_single_run_finds_one_run_of_one_weight_and_nothing_else():
    def weights(rows):
        return torch.tensor(rows, dtype=torch.float32)[..., None]

    assert single_run(weights([[0, 0, 2, 2], [0, 0, 0, 0]])) == (2, 4, 2.0)
    assert single_run(weights([[0, 0, 0, 2], [2, 0, 0, 0]])) == (3, 5, 2.0)  # across rows of the flattened batch
    assert single_run(weights([[0, 2, 0, 2]])) is None  # two runs
    assert single_run(weights([[0, 2, 1, 0]])) is None  # two weights
    assert single_run(weights([[0, 0, 0, 0]])) is None  # nothing gated


@pytest.mark.skipif(not packed.AVAILABLE, reason="oneDNN's packed ops are pinned to another torch here")
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_delta_added_in_place_on_one_run_is_the_formula(rows):
    """The run form (a chain's rows at the end of a batch-1 window) against the formula, and the rows off the run
    the layer's own output exactly."""
    layer, x, a, b, _, _ = _parts(rows)
    weights = torch.zeros(2, rows, 1)
    weights[1, rows // 2 :] = 2.0
    run = single_run(weights)
    assert run is not None
    with torch.no_grad():
        got = fused_delta(PackedWeight(), layer, x, a, b, weights, BlockDiagonal(), run)
        plain = layer(x)
    torch.testing.assert_close(got, plain + weights * ((x @ a.T) @ b.T), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-5)  # packed: fp32 rounding of the same product
