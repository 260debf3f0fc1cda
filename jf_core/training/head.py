"""The LM head where a loss needs it: the final hidden states taken at the head's input, and the head applied to
chosen rows as the model's own forward would (losses.py's memory-lean loss, and the draft adapter's two-pass
forward, context_cache.py, both read hidden states this way)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

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
    # FSDP2 shard, whose hooks a backward inside the forward would run out of turn): losses.py may then take a loss
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
