"""A low-rank delta's arithmetic on a layer's output, `output + w * (x A^T) B^T` with `w` per token (the draft
adapter's gate times its scale: jf_core/draft_adapter/), in the two forms a layer runs it: with autograd after any
layer's output (a forward hook's, training's), and without gradients on a packed layer's product from the As and Bs
kept as its products read them (packed.py's `PackedLinear`, decoding's). The adapter owns A, B and the gate; how the
delta is computed fast on this CPU lives here."""

from __future__ import annotations

import torch


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


def kept(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A target's or a group's As and Bs as a forward without gradients reads them: every A stacked and transposed
    ([in, n r]) and the Bs block-diagonal and transposed ([n r, out]: one addmm for a group of projections,
    siblings.py), both contiguous. Whoever keeps them remakes them when an A or B changes (the adapter's `set_gate`).
    Contiguous because MKL's addmm of a few rows read a transposed view's columns 1.3-1.5x slower at SmolLM2's
    shapes (qkv's 960 x 48: 19.0 against 12.9 us; gate and up's 3,072 x 32: 32.8 against 21.2; 2 threads, 7 rows,
    2026-12-03)."""
    left = torch.cat([t.detach() for t in a]).T.contiguous()
    return left, torch.block_diag(*[t.detach() for t in b]).T.contiguous()


def add_kept_delta(
    output: torch.Tensor,
    x: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    weights: torch.Tensor,
    run: Run | None = None,
) -> torch.Tensor:
    """`output` (a packed product of `x`, fresh; one projection's or a group's side by side) plus `weights * (x A^T)
    B^T` from `kept`'s tensors, without gradients. Where the gate is one run of rows at one weight (a batch-1
    window's chain), the delta is computed on those rows only and added in place, the weight as the addmm's alpha;
    otherwise a new tensor.

    The As once rode in the layer's packed product (stacked under its weight): that kept a second packed copy of
    every adapted weight (471 MiB of a SmolLM2 process with all seven projections adapted, in fp32); the run's rows
    times the As by MKL cost a forward the same within its spread (docs/real-models.md, 2026-12-04)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = output.view(-1, output.shape[-1])
    if run is not None:
        start, stop, value = run
        rows[start:stop].addmm_(flat[start:stop] @ left, right, alpha=value)
        return output
    return torch.addmm(rows, (flat @ left) * weights.view(-1, 1), right).view(output.shape)
