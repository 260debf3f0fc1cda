"""A low-rank delta's arithmetic on a layer's output, `output + w * (x A^T) B^T` with `w` per token (the draft
adapter's gate times its scale: jf_core/draft_adapter/), in the two forms a layer runs it: after any layer's output
(a forward hook's), and fused into a packed layer's product (packed.py's `PackedLinear`). The adapter owns A, B and
the gate; how the delta is computed fast on this CPU lives here, beside the packed product it rides in."""

from __future__ import annotations

import torch
from torch import nn

from jf_core.layers.packed import PackedWeight, stamp


def add_delta(
    output: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """`output` (a layer's, of input `x`) plus `weights * (x A^T) B^T`; `weights` [B, L, 1]."""
    delta = (x @ a.to(x.dtype).T) @ b.to(x.dtype).T
    return torch.addcmul(output, delta, weights.to(delta.dtype))


def add_siblings_delta(
    output: torch.Tensor, x: torch.Tensor, a: list[torch.Tensor], b: list[torch.Tensor], weights: torch.Tensor
) -> torch.Tensor:
    """`add_delta` for projections of one input whose outputs sit side by side in `output` (siblings.py, training):
    every A in one product, the Bs as one block-diagonal product, one addcmul, in `output`'s dtype. With autograd:
    a rank-16 product is too small to pay for its call on this CPU, and a SmolLM2 micro-step made 7,185 of them
    (27% of its time, 2026-12-02); grouped, q, k and v take one of each and gate and up one."""
    dtype = output.dtype
    h = x.to(dtype) @ torch.cat([m.to(dtype) for m in a]).T
    delta = h @ torch.block_diag(*[m.to(dtype) for m in b]).T
    return torch.addcmul(output, delta, weights.to(dtype))


Run = tuple[int, int, float]  # rows [start, stop) of the flattened [B * L] tokens, all at one weight; 0 elsewhere


def single_run(weights: torch.Tensor) -> Run | None:
    """Where per-token weights [B, L, 1] are one value on one contiguous run of the flattened rows and 0 elsewhere
    (a draft chain at the end of a batch-1 window, as decoding lays it out), that run; else None. Read once a
    forward, on the CPU only (on a GPU it would wait for the device, and the fused path is the CPU's)."""
    if weights.device.type != "cpu":
        return None
    flat = weights.reshape(-1)
    on = torch.nonzero(flat).flatten().tolist()
    if not on or on[-1] + 1 - on[0] != len(on):
        return None
    value = flat[on[0]].item()
    return (on[0], on[-1] + 1, value) if bool((flat[on[0] : on[-1] + 1] == value).all()) else None


def _add_on_run(y: torch.Tensor, out: int, rhs: torch.Tensor, run: Run) -> torch.Tensor:
    """The delta added in place on the run's rows of the product's own output (`y`: [..., out + r], fresh): one
    addmm on those rows with the weight as its alpha, where the general form multiplies every row by its weight and
    writes a new [B * L, out] tensor (0.6-0.9 ms of a SmolLM2 forward's 7-8 ms of adapter at widths 5-9,
    2026-12-03). The outputs stay a view of `y`, as a group's members' slices already are."""
    start, stop, value = run
    rows = y.view(-1, y.shape[-1])
    rows[start:stop, :out].addmm_(rows[start:stop, out:], rhs, alpha=value)
    return y[..., :out]


def fused_delta(
    packed: PackedWeight,
    layer: nn.Linear,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    weights: torch.Tensor,
    right: BlockDiagonal | None = None,
    run: Run | None = None,
) -> torch.Tensor:
    """A bias-free packed layer's output with the delta: A stacked under the layer's weight in one packed product
    (`packed` keeps that stack), then B (`right` keeps it transposed, as the addmm reads it): `fused_siblings_delta`
    with one member. The delta's separate small matmuls and forward hooks cost a SmolLM2 window's forward 18 ms on
    this CPU (68 against 50 ms, 2026-11-30); MKL's rank-r products are slow for few rows. Costs one more packed copy
    of the target weights (beside the layer's own, which the base-only forwards use)."""
    right = right if right is not None else BlockDiagonal()
    return fused_siblings_delta(packed, [layer], x, [a], right, [b], weights, run)


class BlockDiagonal:
    """Bs as the right-hand matrix of one addmm: their block-diagonal matrix (one addmm for a group of projections:
    siblings.py), transposed and contiguous, remade when a B is another tensor or was written in place since (a TPF
    probe between training steps). Contiguous because MKL's addmm of a few rows read a transposed view's columns
    1.3-1.5x slower at SmolLM2's shapes (qkv's 960 x 48: 19.0 against 12.9 us; gate and up's 3,072 x 32: 32.8
    against 21.2; 2 threads, 7 rows, 2026-12-03)."""

    def __init__(self) -> None:
        self._stamp: tuple | None = None
        self._matrix: torch.Tensor | None = None

    def of(self, bs: list[torch.Tensor]) -> torch.Tensor:
        now = stamp(*bs)
        if self._stamp != now:
            self._matrix = torch.block_diag(*[b.detach() for b in bs]).T.contiguous()
            self._stamp = now
        return self._matrix


def fused_siblings_delta(
    packed: PackedWeight,
    layers: list[nn.Linear],
    x: torch.Tensor,
    a: list[torch.Tensor],
    b: BlockDiagonal,
    bs: list[torch.Tensor],
    weights: torch.Tensor,
    run: Run | None = None,
) -> torch.Tensor:
    """`fused_delta` for bias-free projections of one input (a layer's q, k and v): their weights and every A in
    one packed product, then the Bs as one block-diagonal addmm; the members' outputs side by side."""
    y = packed.linear(x, (*(layer.weight for layer in layers), *a), None)
    out = sum(layer.out_features for layer in layers)
    if run is not None:
        return _add_on_run(y, out, b.of(bs), run)
    rows = y.view(-1, y.shape[-1])  # [B * L, out + k r]: the outputs, then x A^T for each member
    delta_in = rows[:, out:] * weights.view(-1, 1)
    return torch.addmm(rows[:, :out], delta_in, b.of(bs)).view(*y.shape[:-1], out)
