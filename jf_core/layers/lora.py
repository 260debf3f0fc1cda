"""A low-rank delta's arithmetic on a layer's output, `output + w * (x A^T) B^T` with `w` per token (the draft
adapter's gate times its scale: jf_core/draft_adapter/), in the two forms a layer runs it: after any layer's output
(a forward hook's), and fused into a packed layer's product (packed.py's `PackedLinear`). The adapter owns A, B and
the gate; how the delta is computed fast on this CPU lives here, beside the packed product it rides in."""

from __future__ import annotations

import torch
from torch import nn

from jf_core.layers.packed import PackedWeight


def add_delta(
    output: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """`output` (a layer's, of input `x`) plus `weights * (x A^T) B^T`; `weights` [B, L, 1]."""
    delta = (x @ a.to(x.dtype).T) @ b.to(x.dtype).T
    return torch.addcmul(output, delta, weights.to(delta.dtype))


def fused_delta(
    packed: PackedWeight, layer: nn.Linear, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """A bias-free packed layer's output with the delta: A stacked under the layer's weight in one packed product
    (`packed` keeps that stack), then B. The delta's separate small matmuls and forward hooks cost a SmolLM2
    window's forward 18 ms on this CPU (68 against 50 ms, 2026-11-30); MKL's rank-r products are slow for few rows.
    Costs one more packed copy of the target weights (beside the layer's own, which the base-only forwards use)."""
    y = packed.linear(x, (layer.weight, a), None)
    out = layer.out_features
    rows = y.view(-1, y.shape[-1])  # [B * L, out + r]: the layer's output, then x A^T
    # One addmm adds (gate x scale x A x) B^T to the output: half the time of a matmul and an addcmul here.
    delta_in = rows[:, out:] * weights.view(-1, 1)
    return torch.addmm(rows[:, :out], delta_in, b.T).view(*y.shape[:-1], out)
