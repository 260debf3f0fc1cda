"""The noise-aware causal mask of the packed layouts: blocks, `[prompt][N_0][C_0][N_1][C_1]...[N'_0][N'_1]...`, and
spans, `[prompt][C_0][C_1]...[S][S]...` (`training.packing`).

`N'` are a block's further noisy copies (`training.noisy_copies` > 1: copy c of every block, after the clean
blocks, each block at its own positions again), which see what N_j sees; each copy's blocks see none of another
copy's. They share one context: the prompt and the clean blocks are computed once for them all.

Who sees whom (True = the query may attend to the key):
- prompt: causal within the prompt;
- noisy block N_j ("shipped", the paper's released variant): the whole prompt, the earlier noisy blocks
  N_0..N_{j-1}, and N_j causally; ("clean_context" ablation): the prompt, the earlier clean blocks C_0..C_{j-1},
  and N_j causally;
- clean block C_j: the whole prompt, the earlier clean blocks, and C_j causally;
- drafted span S (the spans layout, jf_core/training/spans.py: a noisy block from its first departure on, at its
  own positions): the prompt and the clean text before its departure (each position's `anchor`: a span's first
  position id, a prompt or clean token's own), and itself causally. That is what a noisy block sees under
  "clean_context", its correct prefix being the clean block's own tokens at the same positions in the same context;
- padding: only itself (a query that sees nothing would make softmax NaN), and no real query sees padding.

`build_mask` gives the dense [B, 1, L, L] bool mask SDPA takes as is (eager would not: transformers adds a 4D mask
to the scores, so a bool one must become additive; training runs SDPA or FlexAttention only,
jf_core/training/losses.py `training_attention`). `mask_mod` states the same rule for FlexAttention's BlockMask on
GPUs.
"""

from __future__ import annotations

import torch

PROMPT, NOISY, CLEAN, PAD, SPAN = 0, 1, 2, 3, 4
VARIANTS = ("shipped", "clean_context")


def layout(
    prompt_len: int, n: int, num_blocks: int, width: int, copies: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kind, block index, noisy copy) of every position of one packed example with `copies` noisy copies of each
    block, padded to `width` (the copy is 0 for the prompt, the clean blocks and the first noisy copy)."""
    pos = torch.arange(width)
    seg = (pos - prompt_len).div(n, rounding_mode="floor")
    pairs = 2 * num_blocks  # segments of the [N_j][C_j] part
    kind = torch.where(seg % 2 == 0, NOISY, CLEAN)
    kind = torch.where(seg >= pairs, NOISY, kind)
    kind = torch.where(pos < prompt_len, PROMPT, kind)
    kind = torch.where(pos >= prompt_len + n * num_blocks * (1 + copies), PAD, kind)
    further = (seg - pairs).clamp(min=0)
    block = torch.where(seg >= pairs, further % max(num_blocks, 1), seg.div(2, rounding_mode="floor"))
    block = torch.where(kind == PROMPT, -1, block)
    copy = torch.where((seg >= pairs) & (kind == NOISY), 1 + further.div(max(num_blocks, 1), rounding_mode="floor"), 0)
    return kind, block, copy


def _rule(kind_q, block_q, copy_q, anchor_q, kind_k, block_k, copy_k, anchor_k, q, k, variant: str) -> torch.Tensor:
    causal = k <= q
    same_block = (kind_q == kind_k) & (block_q == block_k) & (copy_q == copy_k) & causal
    in_blocks = (kind_q == NOISY) | (kind_q == CLEAN)
    if variant == "clean_context":
        history = kind_k == CLEAN
    else:  # a noisy copy's history is its own copy's earlier noisy blocks
        history = (kind_k == NOISY) & (copy_q == copy_k)
    earlier = (block_k < block_q) & (((kind_q == NOISY) & history) | ((kind_q == CLEAN) & (kind_k == CLEAN)))
    prompt_rows = (kind_q == PROMPT) & (kind_k == PROMPT) & causal
    context = (kind_k == PROMPT) | (kind_k == CLEAN)
    span_rows = (kind_q == SPAN) & ((context & (anchor_k < anchor_q)) | same_block)
    return (
        prompt_rows
        | (in_blocks & ((kind_k == PROMPT) | same_block | earlier))
        | span_rows
        | ((kind_q == PAD) & (q == k))
    )


def _filled(
    kind: torch.Tensor, variant: str, copy: torch.Tensor | None, anchor: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both forms' arguments checked and completed in one place: the variant named (`_rule` reads any other as
    shipped), copy 0 where there is one noisy copy, anchor 0 where there are no drafted spans."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown mask variant {variant!r}; expected one of {VARIANTS}")
    copy = torch.zeros_like(kind) if copy is None else copy
    anchor = torch.zeros_like(kind) if anchor is None else anchor
    return copy, anchor


def build_mask(
    kind: torch.Tensor,
    block: torch.Tensor,
    variant: str = "shipped",
    copy: torch.Tensor | None = None,
    anchor: torch.Tensor | None = None,
) -> torch.Tensor:
    """kind, block, copy, anchor: [B, L] from `layout` or a spans row (copy None: one noisy copy; anchor None: no
    drafted spans); returns [B, 1, L, L] bool."""
    copy, anchor = _filled(kind, variant, copy, anchor)
    width = kind.shape[1]
    q = torch.arange(width)[:, None]
    k = torch.arange(width)[None, :]
    mask = _rule(kind[:, :, None], block[:, :, None], copy[:, :, None], anchor[:, :, None], kind[:, None, :],
                 block[:, None, :], copy[:, None, :], anchor[:, None, :], q, k, variant)  # fmt: skip
    return mask[:, None]


def mask_mod(
    kind: torch.Tensor,
    block: torch.Tensor,
    variant: str = "shipped",
    copy: torch.Tensor | None = None,
    anchor: torch.Tensor | None = None,
):
    """The same rule as a FlexAttention mask_mod over batched layouts ([B, L] tensors on the model's device)."""
    copy, anchor = _filled(kind, variant, copy, anchor)

    def mod(b, h, q_idx, kv_idx):
        return _rule(kind[b, q_idx], block[b, q_idx], copy[b, q_idx], anchor[b, q_idx], kind[b, kv_idx],
                     block[b, kv_idx], copy[b, kv_idx], anchor[b, kv_idx], q_idx, kv_idx, variant)  # fmt: skip

    return mod
