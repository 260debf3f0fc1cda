"""A model's repeated decoder blocks, found the way transformers itself groups them (`_no_split_modules`, the classes
it never splits across devices): what FSDP2 shards one by one and what `draft_lora.last_layers` counts from the top,
whatever the architecture names its module list."""

from __future__ import annotations

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated decoder blocks, bottom up."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no repeated decoder layers (it declares no _no_split_modules)")
    return layers
