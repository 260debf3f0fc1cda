"""The noise-aware causal mask of the packed layout [prompt][N_0][C_0][N_1][C_1]...

Who sees whom (True = the query may attend to the key):
- prompt: causal within the prompt;
- noisy block N_j ("shipped", the paper's released variant): the whole prompt, the earlier noisy blocks
  N_0..N_{j-1}, and N_j causally; ("clean_context" ablation): the prompt, the earlier clean blocks C_0..C_{j-1},
  and N_j causally;
- clean block C_j: the whole prompt, the earlier clean blocks, and C_j causally;
- padding: only itself (a query that sees nothing would make softmax NaN), and no real query sees padding.

`build_mask` gives the dense [B, 1, L, L] bool mask SDPA takes as is (eager would not: transformers adds a 4D mask
to the scores, so a bool one must become additive; training runs SDPA or FlexAttention only,
jf_core/training/losses.py `training_attention`). `mask_mod` states the same rule for FlexAttention's BlockMask on
GPUs.
"""

from __future__ import annotations

import torch

PROMPT, NOISY, CLEAN, PAD = 0, 1, 2, 3
VARIANTS = ("shipped", "clean_context")


def layout(prompt_len: int, n: int, num_blocks: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kind, block index) of every position of one packed example, padded to `width`."""
    pos = torch.arange(width)
    seg = (pos - prompt_len).div(n, rounding_mode="floor")
    kind = torch.where(seg % 2 == 0, NOISY, CLEAN)
    kind = torch.where(pos < prompt_len, PROMPT, kind)
    kind = torch.where(pos >= prompt_len + 2 * n * num_blocks, PAD, kind)
    block = torch.where(kind == PROMPT, -1, seg.div(2, rounding_mode="floor"))
    return kind, block


def _rule(kind_q, block_q, kind_k, block_k, q, k, variant: str) -> torch.Tensor:
    causal = k <= q
    same_block = (kind_q == kind_k) & (block_q == block_k) & causal
    in_blocks = (kind_q == NOISY) | (kind_q == CLEAN)
    history_kind = CLEAN if variant == "clean_context" else NOISY
    earlier = (block_k < block_q) & (
        ((kind_q == NOISY) & (kind_k == history_kind)) | ((kind_q == CLEAN) & (kind_k == CLEAN))
    )
    prompt_rows = (kind_q == PROMPT) & (kind_k == PROMPT) & causal
    return prompt_rows | (in_blocks & ((kind_k == PROMPT) | same_block | earlier)) | ((kind_q == PAD) & (q == k))


def build_mask(kind: torch.Tensor, block: torch.Tensor, variant: str = "shipped") -> torch.Tensor:
    """kind, block: [B, L] from `layout`; returns [B, 1, L, L] bool."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown mask variant {variant!r}; expected one of {VARIANTS}")
    width = kind.shape[1]
    q = torch.arange(width)[:, None]
    k = torch.arange(width)[None, :]
    mask = _rule(kind[:, :, None], block[:, :, None], kind[:, None, :], block[:, None, :], q, k, variant)
    return mask[:, None]


def mask_mod(kind: torch.Tensor, block: torch.Tensor, variant: str = "shipped"):
    """The same rule as a FlexAttention mask_mod over batched layouts ([B, L] tensors on the model's device)."""

    def mod(b, h, q_idx, kv_idx):
        return _rule(kind[b, q_idx], block[b, q_idx], kind[b, kv_idx], block[b, kv_idx], q_idx, kv_idx, variant)

    return mod
