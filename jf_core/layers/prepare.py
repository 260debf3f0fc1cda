"""The one step from a loaded model to a model ready to decode on its device."""

from __future__ import annotations

import torch

from jf_core.layers.heads import Fp32LMHead, SlicedLMHead, slice_lm_head, upcast_lm_head
from jf_core.layers.packed import PackedWeight, pack_linears
from jf_core.layers.siblings import group_siblings


def prepare_for_decoding(
    model: torch.nn.Module,
    device: torch.device,
    *,
    lm_head_fp32: bool = False,
) -> torch.nn.Module:
    """`model` on `device` in eval mode, its layers swapped for the ones decoding runs fastest with: the LM head an
        fp32 copy (`lm_head_fp32`: a bf16/fp16 model, fewer argmax flips) or the model's own by vocabulary slices; on a
        CPU its linear layers, and then its head, on oneDNN's packed weights where their size pays (packed.py), the
    projections of one input as one product (siblings.py). Every
        swap keeps the model's parameters, ties and state dict: training the prepared model still trains the same
        weights (packed products run only where no gradient is needed)."""
    upcast_lm_head(model) if lm_head_fp32 else slice_lm_head(model)
    if device.type == "cpu" and pack_linears(model):
        group_siblings(model)
        head = model.get_output_embeddings()
        if isinstance(head, SlicedLMHead | Fp32LMHead):
            head.packed_weight = PackedWeight()
    return model.to(device).eval()
