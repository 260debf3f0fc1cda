"""A CPU stand-in for flash-attention 2 that fails where the real one fails.

Registered through transformers' attention interface under its own name, it
- refuses any mask but a 2D padding mask (or none): flash-attention takes nothing else, and transformers would
  otherwise read a 4D mask as a 2D one and index out of range;
- refuses a model class that does not declare flash-attention support (`_supports_flash_attn`), as loading one
  with `attn_implementation="flash_attention_2"` does;
- with `strict_dtype`, refuses anything but fp16/bf16 inputs, as the CUDA kernels do (fp32 is allowed otherwise, so
  the fp32 lossless tests can run their exact comparison on it);
- runs transformers' own flash-attention integration (`flash_attention_forward`: unpadding by the 2D mask,
  window and softcap arguments, varlen vs dense dispatch) over torch kernels with flash-attn 2's semantics:
  causal masks aligned at the bottom right, `window_size=(left, right)` around that diagonal, `softcap`, GQA.
"""

from __future__ import annotations

import math

import torch

NAME = "flash_attention_2_standin"
_STATE = {"strict_dtype": False, "calls": 0}


def _attend(q, k, v, *, causal: bool, window_size, softcap: float, scale: float | None) -> torch.Tensor:
    """One sequence: q [Lq, H, D], k/v [Lk, Hk, D] -> [Lq, H, D], flash-attn 2's rules."""
    lq, lk, heads = q.shape[0], k.shape[0], q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if softcap and softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    diag = torch.arange(lq)[:, None] + (lk - lq)  # bottom-right aligned: the last query sees the last key
    key = torch.arange(lk)[None, :]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed &= key <= diag
    left, right = window_size
    if left >= 0:
        allowed &= key >= diag - left
    if right >= 0:
        allowed &= key <= diag + right
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that sees nothing outputs zeros, as flash does
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def _check(q, k, v, alibi_slopes, dropout_p) -> None:
    if _STATE["strict_dtype"] and any(t.dtype not in (torch.float16, torch.bfloat16) for t in (q, k, v)):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if alibi_slopes is not None or dropout_p:
        raise NotImplementedError("the stand-in implements neither ALiBi nor dropout")


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    _check(q, k, v, alibi_slopes, dropout_p)
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        ks, ke = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        out[qs:qe] = _attend(
            q[qs:qe], k[ks:ke], v[ks:ke], causal=causal, window_size=window_size, softcap=softcap, scale=softmax_scale
        )
    _STATE["calls"] += 1
    return out


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    _check(q, k, v, alibi_slopes, dropout_p)
    out = torch.stack(
        [
            _attend(q[b], k[b], v[b], causal=causal, window_size=window_size, softcap=softcap, scale=softmax_scale)
            for b in range(q.shape[0])
        ]
    )
    _STATE["calls"] += 1
    return out


def _standin_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.flash_attention import flash_attention_forward

    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise RuntimeError(f"flash-attention takes a 2D padding mask or none; this forward passed {shape}")
    return flash_attention_forward(module, query, key, value, attention_mask, **kwargs)


def install() -> None:
    """Register the stand-in under NAME (idempotent) and load its kernels into transformers' flash cache."""
    import transformers.modeling_flash_attention_utils as fa
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, _standin_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    # transformers keeps the kernels of the last loaded flash implementation in module state, keyed by name.
    fa._loaded_implementation = NAME
    fa._flash_fn, fa._flash_varlen_fn, fa._flash_with_kvcache_fn = flash_attn_func, flash_attn_varlen_func, None
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    fa._process_with_kvcache_kwargs_fn = dict


def use(model: torch.nn.Module, *, strict_dtype: bool = False) -> torch.nn.Module:
    """Switch `model` to the stand-in, as loading it with flash_attention_2 would (or refuse, as that would)."""
    if not getattr(model, "_supports_flash_attn", False):
        raise RuntimeError(f"{type(model).__name__} does not support flash-attention")
    install()
    _STATE["strict_dtype"] = strict_dtype
    model.set_attn_implementation(NAME)
    return model


def calls() -> int:
    """Kernel calls so far (one per attention layer per forward that reached flash-attention)."""
    return _STATE["calls"]
