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

Training on a CPU in bf16 takes one more form here: where a gradient is wanted, the scores as transformers' eager
attention computes them (products in the compute dtype, the softmax in fp32), the query heads folded onto their KV
head so nothing is copied. torch's CPU flash-attention backward in bf16 runs slower than its fp32 one (4.4-6.4
against 2.8-3.5 ms at a spans step's 128 queries over 526 keys, 9 heads on 3), and at a draft adapter's training
shapes (a few dozen to about 140 queries over their context) the eager form's forward and backward took 1.07-1.75x
less time than the kernel's; at 600 queries over 1,024 keys, where its fp32 softmax streams 5.5 M scores, 0.66-0.70x
(2026-12-06, 2 threads, `bench/training_attention.py`). So it takes an attention of at most `EAGER_MAX_SCORES` scores
a sequence; the kernel's forward alone stays the faster, so no-gradient calls (the context pass, decoding) keep it.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from jf_core import pins
from jf_core.layers.packed import switched_off

pins.require("transformers-model")  # the attention interface's call signature and the config's backend name

GROUPED_SDPA = "jf_grouped_sdpa"
# Heads x queries x keys of a sequence past which the eager form's memory traffic costs more than the kernel's slow
# backward: between the 0.6 M scores it won at (1.07-1.19x) and the 5.5 M it lost at (0.66-0.70x); at 1.4 M (398
# queries over 398 keys) the two ran 0.86x and 1.35x in two runs.
EAGER_MAX_SCORES = 2**20
_switch = {"eager": True}


def kernel_backward() -> contextlib.AbstractContextManager:
    """Training's bf16 attention on torch's kernel meanwhile, its backward too: what the eager form saves is
    measured against it (bench/train_throughput.py)."""
    return switched_off(_switch, "eager")


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
    there torch's kernel reads each KV head for its query heads (`enable_gqa`) instead of a copy per query head, or,
    where a bf16 training step wants a gradient, the eager form does (`eager_grouped`)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = not (dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None)
    if not (grouped and plain and attention_mask is not None and query.shape[2] > 1 and query.device.type == "cpu"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    small = query.shape[1] * query.shape[2] * key.shape[2] <= EAGER_MAX_SCORES
    if _switch["eager"] and small and attention_mask.shape[1] == 1 and low_precision_training(query, key, value):
        return eager_grouped(query, key, value, attention_mask, scaling), None
    # With a mask transformers' SDPA never sets is_causal: the mask says everything.
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def low_precision_training(*tensors: torch.Tensor) -> bool:
    """Whether a gradient is wanted of this attention and it computes in bf16 or fp16 (autocast's dtype, or the
    tensors' own)."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return False
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else tensors[0].dtype
    return dtype in (torch.bfloat16, torch.float16)


def eager_grouped(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """Attention as transformers' eager form computes it (scores in the compute dtype, softmax in fp32, the weights
    back in the compute dtype), each KV head read by its query heads in place: [B, Q, H, D] as the attention
    interface returns it. A bool `mask` keeps where True; a float one is added to the scores. A query that sees no
    key gets uniform weights, as eager's additive mask gives, not NaN."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    scale = dim**-0.5 if scaling is None else scaling
    with torch.autocast("cpu", enabled=False):
        # Query heads h * g .. h * g + g - 1 read KV head h (repeat_kv's order): fold them onto it as more rows. The
        # scale goes on the query ([Q, D], not the scores' [Q, K]); at a power of two (1/8 for 64-wide heads) that is
        # exact, the same scores as scaling them.
        folded = (query.to(dtype) * scale).reshape(batch, kv_heads, heads // kv_heads * length, dim)
        scores = (folded @ key.to(dtype).transpose(-1, -2)).view(batch, kv_heads, heads // kv_heads, length, -1)
        mask = mask[..., : key.shape[-2]].unsqueeze(2)  # [B, 1, 1, Q, K] against the folded query heads
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(dtype).min)
        else:
            scores = scores + mask
        # softmax reads the compute dtype and computes in fp32 (no fp32 copy of the scores first), as eager does.
        weights = scores.softmax(-1, dtype=torch.float32).to(dtype).view(batch, kv_heads, -1, scores.shape[-1])
        out = (weights @ value.to(dtype)).view(batch, heads, length, dim)
    return out.transpose(1, 2).contiguous()


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # any mask transformers builds for it is SDPA's


def groups_kv_heads(model: torch.nn.Module) -> bool:
    """Whether the model's query heads share KV heads (GQA or MQA)."""
    config = model.config.get_text_config(decoder=True)
    kv_heads = getattr(config, "num_key_value_heads", None)
    return kv_heads is not None and kv_heads < getattr(config, "num_attention_heads", kv_heads)
