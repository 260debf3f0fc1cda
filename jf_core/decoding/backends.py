"""Which attention backend a model runs on (transformers' `_attn_implementation`), and the switches a decode or a
training run makes for its duration: FlexAttention's models decode on SDPA (`decoding_attention`), SDPA models with
grouped KV heads run on a CPU on SDPA reading them in place (`grouped_attention`, grouped_attention.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from jf_core import pins
from jf_core.decoding.grouped_attention import GROUPED_SDPA, groups_kv_heads

pins.require("transformers-model")  # `_attn_implementation` and set_attn_implementation


def attention_implementation(model_or_config: Any) -> str | None:
    """The attention backend a model (or its config) runs on: transformers' private `_attn_implementation`, the one
    place it is read (pinned in jf_core/pins.py)."""
    return getattr(getattr(model_or_config, "config", model_or_config), "_attn_implementation", None)


@contextlib.contextmanager
def attention_backend(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run the model on attention backend `name` for the duration (transformers' set_attn_implementation)."""
    current = attention_implementation(model)
    if current == name:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(current)


@contextlib.contextmanager
def decoding_attention(model: torch.nn.Module) -> Iterator[None]:
    """Decode a model that trains on FlexAttention on SDPA instead. FlexAttention earns its place in training (a
    block-sparse noise-aware mask over long packed sequences); a decoder's masks are small and change shape every
    forward, which sends FlexAttention through recompiles: the round's TPF probe took 18 s on an H200 that way."""
    if attention_implementation(model) != "flex_attention":
        yield
        return
    with attention_backend(model, "sdpa"):
        yield


@contextlib.contextmanager
def grouped_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run an SDPA model whose query heads share KV heads, on a CPU, on `GROUPED_SDPA` for the duration (a decode, a
    training run: grouped_attention.py says why); any other model runs as it is. Switching costs about 0.3 ms each
    way (transformers' set_attn_implementation), once a decode, not a forward."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    uses_interface = getattr(model, "_supports_attention_backend", False)
    if attention_implementation(model) != "sdpa" or not (on_cpu and uses_interface and groups_kv_heads(model)):
        yield
        return
    with attention_backend(model, GROUPED_SDPA):
        yield
