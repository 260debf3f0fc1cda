"""The spans layout (`training.packing: spans`): `[prompt][C_0][C_1]...[C_m]`, then each noisy block's drafted span.

Under the clean-context mask a noisy block N_j sees the prompt, the clean blocks before it and itself. Its correct
prefix, the tokens before its first departure from the fixed point, is the clean block's own tokens at the same
positions in the same context, so it computes exactly what C_j's prefix computes: in the paper's layout that prefix
is packed, and computed, twice. Here a noisy block keeps only its span, from its first departure to its last
consistency student (`training.draft_span` long, or to the block's end), at its own positions, and the span sees the
clean text before its departure instead of its own copy of it (mask.py: SPAN, its `anchor`). Every student then
sees what it sees in the blocks layout and gets the same logits; the losses, and their gradients for the adapter and
for a whole model alike, are the same functions of the weights (tests/jf_core/training/test_spans.py). What goes is
the copies: at a 3-slot span a GSM8K example of 278 packed tokens keeps about 200, and the context is a plain causal
prompt and answer, computed once (without autograd under a draft adapter) for every span and noisy copy of a visit.

The shipped mask's noisy blocks see the earlier noisy blocks instead, a context no clean prefix stands for: that
mask keeps the blocks layout (the config refuses the pair).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from jf_core.draft_adapter.adapter import drafted_slots
from jf_core.training.mask import CLEAN, PROMPT, SPAN
from jf_core.training.packing import PackedExample, PackedRow, consistency_targets, first_departure


def spans_row(
    ex: PackedExample,
    span: int = 0,
    guessed: Callable[[PackedExample, int], int] | None = None,
    guessed_weight: float = 1.0,
) -> PackedRow:
    """`ex` (every noisy copy a visit drew) in the spans layout, with `span` (training.draft_span) positions a
    span at most (0: to the block's end). `guessed` (guessed.py's `TextGuesses.depth`): how deep the text
    proposers guess the answer from a root; a student within that depth of its span's root weighs `guessed_weight`
    in the consistency loss (training.guessed_weight), the others 1, and a span whose students all weigh 0 is not
    packed."""
    p, n = len(ex.prompt), ex.n
    ids = list(ex.prompt) + [t for clean in ex.clean for t in clean]
    context = ex.context_length  # = len(ids): PackedExample refuses a block of other than n tokens
    positions = list(range(context))
    kind = [PROMPT] * p + [CLEAN] * (context - p)
    block = [-1] * p + [j for j in range(ex.num_blocks) for _ in range(n)]
    copy = [0] * context
    anchor = list(positions)  # a context key is seen by the spans anchored past it
    # AR: each clean token from the one before it, the prompt's last for C_0[0]: the context is one causal text.
    ar = [(p + j * n + t - 1, ex.clean[j][t]) for j in range(ex.num_blocks) for t in range(ex.lengths[j])]
    cons, drafted, weights = [], [], []
    for c, noisy_blocks in enumerate([ex.noisy, *ex.extra_noisy]):
        for j, noisy in enumerate(noisy_blocks):
            first = first_departure(ex, j, ex.lengths[j], noisy)
            targets = [] if first is None else consistency_targets(ex, j, first, span)
            if guessed is not None and targets:
                held = guessed_students(guessed, ex, j, first, targets)
                weighed = [(t, hard, guessed_weight if g else 1.0) for (t, hard), g in zip(targets, held, strict=True)]
                targets = [(t, hard) for t, hard, w in weighed if w > 0]
                weights += [w for _, _, w in weighed if w > 0]
            if not targets:
                continue  # at its fixed point, departing only past EOS, or all guessed at weight 0: nothing packed
            end, start, at = targets[-1][0] + 1, len(ids), p + j * n + first
            ids += noisy[first:end]
            positions += range(at, at + end - first)
            kind += [SPAN] * (end - first)
            block += [j] * (end - first)
            copy += [c] * (end - first)
            anchor += [at] * (end - first)
            cons += [(start + t - first, p + j * n + t, hard) for t, hard in targets]
            # The decoder's rule: never the root slot 0, which the base computes (draft_adapter/adapter.py).
            drafted += [start + t - first for t in drafted_slots(range(end), first)]
    tensor = torch.tensor
    return PackedRow(
        ids, positions, tensor(kind), tensor(block), tensor(copy), tensor(anchor), ar, cons, drafted,
        None if guessed is None else weights,
    )  # fmt: skip


def guessed_students(
    guessed: Callable[[PackedExample, int], int], ex: PackedExample, j: int, first: int, targets: list[tuple[int, int]]
) -> list[bool]:
    """Whether the text already guesses each of block j's students (`consistency_targets`' (offset, target) pairs
    from its first departure `first`): the span's root is the token this forward fixes at the departure, and a
    student at offset t drafts the answer's token t - first + 1 places past it, as the next forward's window would
    hold it; `guessed(ex, root)` (guessed.py's `TextGuesses.depth`) says how deep the text's guess from there is
    right."""
    depth = guessed(ex, j * ex.n + first)
    return [t - first + 1 <= depth for t, _ in targets]
