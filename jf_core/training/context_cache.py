"""A draft adapter's training forward in two passes: the base's context once without autograd, as a KV cache, then
the drafted positions with autograd over it.

A draft adapter acts only where the draft gate is 1 (the drafted tokens of the noisy blocks); the base under it is
frozen. Every position whose hidden states depend on no gated position, through any chain of attention, is
therefore a function of frozen weights alone: the prompt, the clean copies (the teacher and the AR loss's
positions), the padding, and under the clean-context mask each noisy block's undrafted first token. In the one
packed forward autograd still records them and backward runs through them, work whose gradient is zero: with
96-token answers in blocks of 16 they are about two thirds of a packed example. Here they run first under
`no_grad`, leaving their keys and values in a cache, and only the positions that depend on the adapter run with
autograd, each attending to that cache and to one another under the same mask. It is the same function as the
one packed forward (the same keys under the same mask, summed in another order), measured to the same losses and
gradients in `tests/jf_core/training/test_context_cache.py`; the split comes from the mask itself, so the shipped
mask, whose noisy blocks see the earlier noisy (drafted) ones, moves those blocks' undrafted tokens into the
second pass too.

Positions that depend on the adapter but that no loss position reads, directly or through the positions it
attends to, are not computed at all (`read_by_losses`; their hidden states are zeros): the post-EOS tail of an
answer's last block, and with `training.draft_span` K every noisy position past each block's first K drafted
ones, so a 1-slot span computes one position a block with autograd instead of the rest of the block.

Only where the packed batch carries its dense mask (SDPA: CPU training; FlexAttention's block masks on a GPU take
the one pass).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from jf_core.decoding.kv import cache_kwargs
from jf_core.draft_adapter.adapter import draft_adapter, gated
from jf_core.training.context_store import ContextStore, batch_cache
from jf_core.training.head import Batch, hidden_states_at_head
from jf_core.training.mask import CLEAN, PROMPT


def applies(model: torch.nn.Module, batch: Batch) -> bool:
    """True where the two passes compute the packed forward: a model whose only trainable weights are its draft
    adapter's, and a batch with its dense mask and draft gate."""
    if draft_adapter(model) is None or "attention_mask" not in batch or "draft_gate" not in batch:
        return False
    if batch["attention_mask"].dtype != torch.bool or not bool(batch["draft_gate"].any()):
        return False
    return not any(p.requires_grad for n, p in model.named_parameters() if not n.startswith("jf_draft_adapter."))


def _closure(pulls: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """[B, L] bool: `start` and every position i with pulls[b, i, j] for some j already in it, to a fixed point (at
    most as many rounds as the longest chain of attention between positions)."""
    while True:
        grown = start | (pulls & start[:, None, :]).any(dim=-1)
        if torch.equal(grown, start):
            return start
        start = grown


def adapter_dependent(mask: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """[B, L] bool: the positions whose hidden states depend on a gated one (gated themselves, or attending to such
    a position, directly or through others). mask [B, 1, L, L] bool (query, key); gate [B, L]."""
    return _closure(mask[:, 0], gate > 0)


def read_by_losses(mask: torch.Tensor, batch: Batch) -> torch.Tensor:
    """[B, L] bool: the positions a loss reads (the consistency term's students and teachers, the AR term's
    sources) and every position they attend to, directly or through others. mask [B, 1, L, L] bool."""
    read = torch.zeros(mask.shape[0], mask.shape[-1], dtype=torch.bool, device=mask.device)
    for index, valid in (
        (batch["cons_student"], batch["cons_valid"]),
        (batch["cons_teacher"], batch["cons_valid"]),
        (batch["ar_src"], batch["ar_tgt"] != -100),
    ):
        rows, slots = valid.nonzero(as_tuple=True)
        read[rows, index[rows, slots]] = True
    return _closure(mask[:, 0].transpose(1, 2), read)  # a key is read where a read query sees it


def _stored_context(batch: Batch) -> torch.Tensor | None:
    """[B]: each row's context length where the batch names its examples and each row's context is a causal text at
    its start (the spans layout: prompt and clean answer, then the spans); None elsewhere (the blocks layout
    interleaves its noisy blocks with the clean ones)."""
    if "example" not in batch:
        return None
    kind = batch["layout_kind"]
    context = (kind == PROMPT) | (kind == CLEAN)
    length = context.sum(dim=1)
    at_start = torch.arange(kind.shape[1], device=kind.device)[None, :] < length[:, None]
    return length if bool(torch.equal(context, at_start)) else None


def _permuted(mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    batch, _, width, _ = mask.shape
    rows = mask.gather(2, order[:, None, :, None].expand(batch, 1, width, width))
    return rows.gather(3, order[:, None, None, :].expand(batch, 1, width, width))


def hidden_states(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The final hidden states [B, L, H] (at the LM head's input) of the packed forward, the adapter on the gated
    positions: the base's context under no_grad, the adapter-dependent positions with autograd over its cache."""
    return forward(model, batch)[0]


def forward(
    model: torch.nn.Module, batch: Batch, store: ContextStore | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`hidden_states`, the [B, L] positions they depend on the adapter at: `adapter_dependent`): a loss over
    positions none of which is dependent has no gradient. `store`: the examples' contexts kept between visits
    (context_store.py), for a spans-layout batch that names its examples (`example`)."""
    mask, gate = batch["attention_mask"], batch["draft_gate"]
    dependent = adapter_dependent(mask, gate)
    unread = dependent & ~read_by_losses(mask, batch)
    # Each row's context first, in its own order (its keys precede its queries, as the mask's causal rule wants),
    # then the adapter-dependent positions a loss reads, then those none reads. Rows differ in how much context
    # they have; the first pass takes what every row has, and a row with more runs the rest of its context in the
    # second pass (ungated there, so still the base's). The second pass is as wide as the widest row needs; a row
    # that needs less computes some of its unread positions too (correctly: they see what they always saw, since
    # a read position never attends to an unread one), and the rest are not computed.
    order = torch.sort(dependent.to(torch.int8) + unread.to(torch.int8), dim=1, stable=True).indices
    first = int((~dependent).sum(dim=1).min())
    last = max(first + 1, int((~unread).sum(dim=1).max()))
    ids, positions = batch["input_ids"].gather(1, order), batch["position_ids"].gather(1, order)
    permuted = _permuted(mask, order)
    if permuted[:, :, :first, first:].any():
        raise RuntimeError("a context position attends to a later-pass position: the two passes would differ")
    cache = DynamicCache()
    parts = []
    context = _stored_context(batch)
    if store is not None and context is not None:
        # The first pass is each row's context alone (what every visit of its example shares), read from the store
        # or computed there; a row with a longer context than the batch's shortest runs the rest in the second pass.
        first = int(context.min())
        rows = [store.get(model, int(e), batch["input_ids"][b, :n], batch["position_ids"][b, :n])
                for b, (e, n) in enumerate(zip(batch["example"], context.tolist(), strict=True))]  # fmt: skip
        cache, hidden = batch_cache(rows, first)
        parts.append(hidden)
    elif first:
        with torch.no_grad(), hidden_states_at_head(model) as seen:
            model(
                input_ids=ids[:, :first],
                position_ids=positions[:, :first],
                attention_mask=permuted[:, :, :first, :first],
                **cache_kwargs(model, cache),
            )
        parts.append(seen["hidden"])
    with gated(model, gate.gather(1, order)[:, first:last]), hidden_states_at_head(model) as seen:
        model(
            input_ids=ids[:, first:last],
            position_ids=positions[:, first:last],
            attention_mask=permuted[:, :, first:last, :last],
            **cache_kwargs(model, cache),
        )
    parts.append(seen["hidden"])
    if last < ids.shape[1]:  # read by no loss: never computed
        parts.append(parts[-1].new_zeros((ids.shape[0], ids.shape[1] - last, parts[-1].shape[-1])))
    hidden = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    back = torch.argsort(order, dim=1)
    return hidden.gather(1, back[..., None].expand(-1, -1, hidden.shape[-1])), dependent
