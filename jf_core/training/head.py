"""The LM head where a loss needs it: the final hidden states taken at the head's input, and the head applied to
chosen rows as the model's own forward would (losses.py's memory-lean loss, and the draft adapter's two-pass
forward, context_cache.py, both read hidden states this way), a chunk of rows at a time (`chunked_sum`).

Each chunk is checkpointed when training (its logits recomputed in backward instead of kept). Where no gradient
reaches the head's weights (a draft adapter's frozen base), a chunk's gradient with respect to its rows is taken as
the chunk is computed and only that is kept ([rows, hidden]): the backward neither keeps the logits nor recomputes
them, two LM-head products a chunk fewer than checkpointing (the teacher's and the student's again)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from jf_core.layers.packed import switched_off

Batch = dict[str, torch.Tensor]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the model in .module; FSDP2 shards it in place


def head_fn(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden [N, H] -> fp32 logits [N, V], as the model's own forward would compute them."""
    inner = unwrap(model)
    head = inner.get_output_embeddings()
    config = inner.config
    scaling = getattr(config, "logits_scaling", None)  # Granite divides
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma2

    def fn(hidden: torch.Tensor) -> torch.Tensor:
        logits = head(hidden).float()
        if scaling:
            logits = logits / scaling
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        return logits

    # No gradient reaches the head's own weights (a draft adapter's frozen base), and they are plain tensors (not an
    # FSDP2 shard, whose hooks a backward inside the forward would run out of turn): `chunked_sum` may take a loss
    # chunk's gradient as it computes the chunk.
    fn.frozen = all(not p.requires_grad and type(p.data) is torch.Tensor for p in head.parameters())
    return fn


@contextlib.contextmanager
def hidden_states_at_head(model: torch.nn.Module) -> Iterator[dict]:
    """While open, the model's forward hands its LM head zero positions (so it computes no logits) and the real
    final hidden state lands in `captured["hidden"]`."""
    captured: dict = {}
    head = unwrap(model).get_output_embeddings()

    def grab(_module, args):
        hidden = args[0]
        captured["hidden"] = hidden
        return (hidden[..., :0, :],)

    handle = head.register_forward_pre_hook(grab)
    try:
        yield captured
    finally:
        handle.remove()


_switch = {"gradient_now": True}


def checkpointed_heads() -> contextlib.AbstractContextManager:
    """Every loss chunk checkpointed meanwhile, a frozen head's too: what taking the gradient in the forward saves is
    measured against it (bench/loss_terms.py)."""
    return switched_off(_switch, "gradient_now")


class _GradientNow(torch.autograd.Function):
    """A loss chunk `fn(rows, *others)` whose gradient reaches `rows` alone (the LM head frozen, `others` constant):
    the gradient is taken in the forward, by a backward local to the chunk, and kept; the step's backward scales it
    by the gradient arriving from the loss. The logits live only while the chunk is computed, as under a checkpoint,
    but are computed once: a checkpoint's backward runs the chunk's forward again, both heads (the teacher's too)."""

    @staticmethod
    def forward(ctx, fn: Callable[..., torch.Tensor], rows: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            leaf = rows.detach().requires_grad_()
            # fn sees a view, not the leaf: a module hook that tracks its inputs' gradients (FlopCounterMode's, for
            # one) cannot ask of a leaf whether autograd.grad will reach it.
            value = fn(leaf.view_as(leaf), *others)
            (grad,) = torch.autograd.grad(value, leaf)
        ctx.save_for_backward(grad)
        ctx.others = len(others)
        return value.detach()

    @staticmethod
    def backward(ctx, upstream: torch.Tensor) -> tuple:
        (grad,) = ctx.saved_tensors
        return None, grad * upstream.to(grad.dtype), *([None] * ctx.others)


def chunked_sum(
    fn: Callable[..., torch.Tensor], *tensors: torch.Tensor, chunk: int, frozen_head: bool = False
) -> torch.Tensor:
    """sum of fn(*(t[i:i + chunk] for t in tensors)) over chunks of rows. When training, each chunk is checkpointed
    (backward recomputes its logits instead of keeping them), or, with `frozen_head` (no gradient reaches the head's
    weights) and a gradient wanted of the first tensor's rows alone, its gradient taken now (`_GradientNow`)."""
    total = tensors[0].new_zeros((), dtype=torch.float32)
    now = (
        _switch["gradient_now"]
        and frozen_head
        and tensors[0].requires_grad
        and not any(t.requires_grad for t in tensors[1:])
    )
    for start in range(0, len(tensors[0]), chunk):
        parts = [t[start : start + chunk] for t in tensors]
        if not torch.is_grad_enabled():
            total = total + fn(*parts)
        elif now:
            total = total + _GradientNow.apply(fn, *parts)
        else:
            total = total + checkpoint(fn, *parts, use_reentrant=False)
    return total


def frozen(head: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Whether no gradient reaches the head's weights (`head_fn` says so of the model's own head)."""
    return getattr(head, "frozen", False)
