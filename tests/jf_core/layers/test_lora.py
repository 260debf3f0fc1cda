"""The low-rank delta's two forms (jf_core/layers/lora.py): with autograd after a layer's output, and without
gradients on a packed product from the As and Bs kept as its products read them (in place on a chain's one run of
rows), both `output + w * (x A^T) B^T` with a weight per token (0 where the adapter does not act)."""

from __future__ import annotations

import pytest
import torch

from jf_core.layers import packed
from jf_core.layers.lora import add_delta, add_kept_delta, kept, single_run
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


def _packed_product(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return PackedWeight().linear(x, layer.weight, layer.bias) if packed.AVAILABLE else layer(x)


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_delta_from_the_kept_as_and_bs_is_the_formula(rows):
    layer, x, a, b, weights, want = _parts(rows)
    with torch.no_grad():
        got = add_kept_delta(_packed_product(layer, x), x, *kept([a], [b]), weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)  # packed: fp32 rounding, not bit for bit


def test_a_groups_kept_delta_is_each_members_own():
    """Projections of one input side by side (siblings.py): one product of the stacked As and one of the
    block-diagonal Bs give each member its own delta and nothing of another's."""
    torch.manual_seed(1)
    layers = [torch.nn.Linear(24, n, bias=True) for n in (16, 8, 8)]
    a = [torch.randn(3, 24) for _ in layers]
    b = [torch.randn(n.out_features, 3) for n in layers]
    x = torch.randn(1, 5, 24)
    weights = torch.tensor([[0.0, 0.0, 1.5, 1.5, 0.0]])[..., None]
    with torch.no_grad():
        output = torch.cat([layer(x) for layer in layers], dim=-1)
        got = add_kept_delta(output.clone(), x, *kept(a, b), weights)
        want = torch.cat([layer(x) + weights * ((x @ m.T) @ n.T) for layer, m, n in zip(layers, a, b, strict=True)], -1)
    torch.testing.assert_close(got, want)


def test_single_run_finds_one_run_of_one_weight_and_nothing_else():
    def weights(rows):
        return torch.tensor(rows, dtype=torch.float32)[..., None]

    assert single_run(weights([[0, 0, 2, 2], [0, 0, 0, 0]])) == (2, 4, 2.0)
    assert single_run(weights([[0, 0, 0, 2], [2, 0, 0, 0]])) == (3, 5, 2.0)  # across rows of the flattened batch
    assert single_run(weights([[0, 2, 0, 2]])) is None  # two runs
    assert single_run(weights([[0, 2, 1, 0]])) is None  # two weights
    assert single_run(weights([[0, 0, 0, 0]])) is None  # nothing gated


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_delta_added_in_place_on_one_run_is_the_formula(rows):
    """The run form (a chain's rows at the end of a batch-1 window) against the formula, written into the product's
    own output, and the rows off the run the product's exactly."""
    layer, x, a, b, _, _ = _parts(rows)
    weights = torch.zeros(2, rows, 1)
    weights[1, rows // 2 :] = 2.0
    run = single_run(weights)
    assert run is not None
    with torch.no_grad():
        product = _packed_product(layer, x)
        plain = product.clone()
        got = add_kept_delta(product, x, *kept([a], [b]), weights, run)
    assert got.data_ptr() == product.data_ptr()  # in place: no new tensor
    torch.testing.assert_close(got, layer(x).detach() + weights * ((x @ a.T) @ b.T), rtol=1e-5, atol=1e-4)
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1, : rows // 2], plain[1, : rows // 2])
