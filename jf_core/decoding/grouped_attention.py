"""SDPA that reads grouped KV heads in place for a multi-token window on a CPU (`grouped_attention`).

A model with grouped-query attention (GQA: SmolLM2-135M's 9 query heads share 3 KV heads) runs transformers' SDPA,
which for more than one query token copies every cached key and value once per query head it serves (`repeat_kv`)
before calling torch's kernel: on SmolLM2-135M at a 261-slot cache that copy was 4.6 ms of an 11-slot Jacobi forward
(about 9% of an AR step; 2026-12-06, torch profiler), paid by every window, draft branch and prefill, never by AR's
single token (transformers folds one query's heads onto the KV heads instead). torch's kernel takes the grouped
heads itself (`enable_gqa=True`): no copy, half the attention time at that shape, and bitwise the same output as the
copied heads (tests/jf_core/decoding/test_grouped_attention.py), so a decoder's output does not change.

transformers uses `enable_gqa` only where there is no mask (a CUDA kernel falls back to its slow path with one);
the exact decoders always pass a 4D mask, and training on a CPU its dense noise-aware one. So this is a backend of
its own, registered with transformers' attention interface, that the Jacobi decoders switch a model to for a decode
and training for its run (`jf_core.decoding.backends.grouped_attention`): every other call (one query token, a GPU,
no grouped heads, position biases or soft-capping) goes to transformers' own SDPA unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from jf_core import pins

pins.require("transformers-model")  # the attention interface's call signature and the config's backend name

GROUPED_SDPA = "jf_grouped_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention function, except for a masked multi-token query over grouped KV heads on a CPU:
    there torch's kernel reads each KV head for its query heads (`enable_gqa`) instead of a copy per query head."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = not (dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None)
    if not (grouped and plain and attention_mask is not None and query.shape[2] > 1 and query.device.type == "cpu"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask transformers' SDPA never sets is_causal: the mask says everything.
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # any mask transformers builds for it is SDPA's


def groups_kv_heads(model: torch.nn.Module) -> bool:
    """Whether the model's query heads share KV heads (GQA or MQA)."""
    config = model.config.get_text_config(decoder=True)
    kv_heads = getattr(config, "num_key_value_heads", None)
    return kv_heads is not None and kv_heads < getattr(config, "num_attention_heads", kv_heads)
