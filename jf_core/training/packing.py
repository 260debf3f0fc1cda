"""Sequence packing: each prompt's blocks as one example, and the batch collator with the layouts a batch row takes
(`PackedRow`): `blocks_row`, the paper's `[prompt][noisy_0][clean_0][noisy_1][clean_1]...`, described here, and
spans.py's `spans_row` (`training.packing: spans`), the same losses from fewer tokens under the clean-context mask.

Both copies of block j share position ids P + j*n + (0..n-1), so the noisy and the clean stream are two causal
"universes" over the same prompt. The mask (mask.py) is built in the collator from the layout, never stored.

With `training.noisy_copies` = K > 1, each visit draws K - 1 further noisy copies of every block from its states
(`redrawn`), packed after the clean blocks (`[noisy'_0][noisy'_1]...` per copy, at the blocks' own positions): they
see the same prompt and clean blocks, so one context serves K noisy copies. A draft adapter's step computes that
context once, without autograd (context_cache.py): 207 of a SmolLM2 GSM8K example's 278 positions (2026-12-02).

Maximum length policy: whole (noisy, clean) pairs are dropped from the end until the example fits, because a block
without its predecessors has no clean prefix; an example whose first pair does not fit is skipped. Blocks must be
contiguous from 0: a gap ends the example there (upstream's cyclic packer leaves gaps: clean blocks stop continuing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from jf_core.draft_adapter.adapter import draft_gate, drafted_slots
from jf_core.training.mask import NOISY, PAD, SPAN, build_mask, layout
from jf_core.training.noise import NoiseSchedule


@dataclass
class PackedExample:
    prompt_id: str
    prompt: list[int]
    n: int
    noisy: list[list[int]]
    clean: list[list[int]]
    lengths: list[int]  # valid tokens per clean block (n, or through EOS)
    # Every draft state recorded for each block (the fixed point last), so that the noisy copy can be drawn again
    # each time the example is seen (`redrawn`) and states collected later (on-policy) can join the pool.
    states: list[list[list[int]]] = field(default_factory=list)
    # Further noisy copies of every block, drawn per visit (`redrawn`): [copy][block][token]; never stored.
    extra_noisy: list[list[list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every layout puts block j's tokens at p + j * n (each noisy copy at the same positions): a block of another
        # length would shift every later position silently. Per block: a long and a short block can sum to k x n.
        noisy = [(f"noisy copy {c}", b) for c, b in enumerate([self.noisy, *self.extra_noisy])]
        for what, blocks in [("clean", self.clean), *noisy]:
            if len(blocks) != self.num_blocks or any(len(b) != self.n for b in blocks):
                raise ValueError(
                    f"packed example {self.prompt_id!r}: {what} blocks of {[len(b) for b in blocks]} tokens, "
                    f"not {self.num_blocks} blocks of n = {self.n}"
                )

    @property
    def num_blocks(self) -> int:
        return len(self.clean)

    @property
    def copies(self) -> int:
        return 1 + len(self.extra_noisy)

    @property
    def total_length(self) -> int:
        return self.length_with(self.copies)

    @property
    def context_length(self) -> int:
        """The clean text: the prompt and every clean block (spans.py's causal context, what the kept-context store
        holds)."""
        return len(self.prompt) + self.num_blocks * self.n

    def length_with(self, copies: int) -> int:
        """The packed length with `copies` noisy copies of every block (stored examples hold one; a visit draws the
        rest: what training goes through)."""
        return self.context_length + copies * self.num_blocks * self.n

    def input_ids(self) -> list[int]:
        ids = list(self.prompt)
        for noisy, clean in zip(self.noisy, self.clean, strict=True):
            ids += noisy + clean
        for copy in self.extra_noisy:
            ids += [t for noisy in copy for t in noisy]
        return ids

    def position_ids(self) -> list[int]:
        p = len(self.prompt)
        block = [list(range(p + j * self.n, p + (j + 1) * self.n)) for j in range(self.num_blocks)]
        pairs = [pos for j in range(self.num_blocks) for pos in block[j] + block[j]]
        return (
            list(range(p)) + pairs + [pos for _ in self.extra_noisy for j in range(self.num_blocks) for pos in block[j]]
        )

    def noisy_blocks(self) -> Iterator[tuple[int, list[int], int]]:
        """(block index, noisy copy's tokens, where it starts) of every noisy copy of every block."""
        for j, noisy in enumerate(self.noisy):
            yield j, noisy, self.noisy_start(j)
        after = len(self.prompt) + 2 * self.num_blocks * self.n
        for c, copy in enumerate(self.extra_noisy):
            for j, noisy in enumerate(copy):
                yield j, noisy, after + (c * self.num_blocks + j) * self.n

    def noisy_start(self, j: int) -> int:
        return len(self.prompt) + 2 * j * self.n

    def clean_start(self, j: int) -> int:
        return self.noisy_start(j) + self.n


@dataclass
class PackStats:
    examples: int = 0
    blocks: int = 0
    dropped_blocks: dict = field(default_factory=lambda: defaultdict(int))


def pack_records(
    records: Iterable[dict], schedule: NoiseSchedule, max_length: int, copies: int = 1, noisy_width: int | None = None
) -> tuple[list[PackedExample], PackStats]:
    """Each prompt's blocks packed as one example, its noisy copies picked by `schedule`, as many whole blocks as
    fit `max_length` with `copies` noisy copies each, a noisy copy taking at most `noisy_width` positions (None: a
    whole block, as the blocks layout packs it; the spans layout's at most `draft_span`)."""
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_prompt[r["prompt_id"]].append(r)
    stats = PackStats()
    out = []
    for prompt_id in sorted(by_prompt):
        rows = sorted(by_prompt[prompt_id], key=lambda r: r["block_index"])
        contiguous = []
        for expected, r in enumerate(rows):
            if r["block_index"] != expected:
                stats.dropped_blocks["gap"] += len(rows) - expected
                break
            contiguous.append(r)
        prompt, n = contiguous[0]["prompt_ids"], contiguous[0]["n"]
        fits = max(0, (max_length - len(prompt)) // (n + copies * min(n, noisy_width or n)))
        if fits < len(contiguous):
            stats.dropped_blocks["max_length"] += len(contiguous) - fits
            contiguous = contiguous[:fits]
        if not contiguous:
            continue
        noisy = []
        for r in contiguous:
            pick = schedule.pick(r["states"], r["fixed_point"], r["length"], r["block_index"], prompt_id)
            noisy.append(list(r["states"][pick]))
        out.append(
            PackedExample(
                prompt_id=prompt_id,
                prompt=list(prompt),
                n=n,
                noisy=noisy,
                clean=[list(r["fixed_point"]) for r in contiguous],
                lengths=[r["length"] for r in contiguous],
                states=[[list(s) for s in r["states"]] for r in contiguous],
            )
        )
        stats.examples += 1
        stats.blocks += len(contiguous)
    return out, stats


def redrawn(ex: PackedExample, schedule: NoiseSchedule, visit: int, copies: int = 1) -> PackedExample:
    """`ex` with each block's noisy copy (and `copies` - 1 further ones) drawn again from all its states, as the
    schedule picks for the `visit`-th time the example is seen: the draw is seeded by (schedule seed, visit, copy,
    prompt, block), so a seeded schedule (random, progressive_phase, uniform_state) meets a block's other states on
    later visits and copies, reproducibly, while a deterministic one (progressive, reverse) picks what packing
    picked. Visit 0's first copy is packing's own pick."""
    if not ex.states:
        raise ValueError(f"packed example {ex.prompt_id!r} holds no states to draw from (packed before they were kept)")

    def drawn(draw: int) -> list[list[int]]:
        pick = replace(schedule, seed=schedule.seed + 1_000_003 * draw).pick
        return [
            list(states[pick(states, clean, length, j, ex.prompt_id)])
            for j, (states, clean, length) in enumerate(zip(ex.states, ex.clean, ex.lengths, strict=True))
        ]

    # One copy a visit draws as it always did (seed + 1_000_003 x visit); K copies take K consecutive draws.
    sets = [drawn(visit * copies + c) for c in range(copies)]
    return replace(ex, noisy=sets[0], extra_noisy=sets[1:])


def first_departure(ex: PackedExample, j: int, upto: int, noisy: list[int] | None = None) -> int | None:
    """The first offset (below `upto`) where block j's noisy copy (`noisy`, default its first) departs from its
    fixed point; None: none does."""
    noisy = ex.noisy[j] if noisy is None else noisy
    return next((t for t in range(upto) if noisy[t] != ex.clean[j][t]), None)


def loss_positions(ex: PackedExample, span: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """(AR pairs (source position, target token), consistency triples (student pos, teacher pos, hard target)).

    AR: every clean-block token through its valid length, predicted from the clean token before it (for C_j[0]:
    the last token of C_{j-1}, or of the prompt). Consistency: for block j, offsets t from the first position where
    N_j differs from C_j (`consistency_targets`); the student is N_j[t], the teacher C_j[t]. Every noisy copy of a
    block is a student of the same teacher."""
    ar, cons = [], []
    p = len(ex.prompt)
    for j in range(ex.num_blocks):
        c0, length = ex.clean_start(j), ex.lengths[j]
        prev = p - 1 if j == 0 else ex.clean_start(j - 1) + ex.n - 1
        sources = [prev] + [c0 + t for t in range(ex.n - 1)]
        ar += [(sources[t], ex.clean[j][t]) for t in range(length)]
    for j, noisy, n0 in ex.noisy_blocks():
        first = first_departure(ex, j, ex.lengths[j], noisy)
        if first is not None:
            cons += [(n0 + t, ex.clean_start(j) + t, hard) for t, hard in consistency_targets(ex, j, first, span)]
    return ar, cons


def consistency_targets(ex: PackedExample, j: int, first: int, span: int = 0) -> list[tuple[int, int]]:
    """(offset t, hard target) of block j's consistency students, from its first departure `first` to the block's
    end (`span` > 0: the first `span` of them, the slots a draft chain that long reads); t is kept while the token
    it predicts is valid (post-EOS positions are ignored). The hard target is the fixed-point token t predicts."""
    out = []
    length = ex.lengths[j]
    for t in range(first, span_end(first, ex.n, span)):
        if t + 1 < length:
            hard = ex.clean[j][t + 1]
        elif t == ex.n - 1 and length == ex.n:
            hard = ex.clean[j + 1][0] if j + 1 < ex.num_blocks else -100
        else:
            break
        out.append((t, hard))
    return out


def span_end(first: int, n: int, span: int) -> int:
    """Where a block's drafted span starting at offset `first` ends: `span` slots on (0: the block's end)."""
    return n if span == 0 else min(n, first + span)


def draft_positions(ex: PackedExample, span: int = 0) -> list[int]:
    """The positions a draft adapter acts on: each noisy block's tokens from its first departure from the fixed
    point on (`span` > 0: that many, as a draft chain of `span` slots is gated and the slots past it are the
    base's). The correct prefix before it stands for what the decoder has committed (the base's KV cache) and for
    the window's first token (computed by the base), so the base computes it here too."""
    out: list[int] = []
    for j, noisy, start in ex.noisy_blocks():
        first = first_departure(ex, j, ex.n, noisy)
        block = range(start, start + (ex.n if first is None else span_end(first, ex.n, span)))
        out += drafted_slots(block, ex.n if first is None else first)  # the decoder's rule (draft_adapter/adapter.py)
    return out


@dataclass
class PackedRow:
    """One example as the batch holds it, in some layout (`blocks_row`, spans.py `spans_row`): its tokens, position
    ids, each position's layout (mask.py: kind, block, noisy copy, anchor), its loss positions (`loss_positions`'
    form) and its drafted positions (the draft gate's 1s)."""

    ids: list[int]
    positions: list[int]
    kind: torch.Tensor
    block: torch.Tensor
    copy: torch.Tensor
    anchor: torch.Tensor
    ar: list[tuple[int, int]]
    cons: list[tuple[int, int, int]]
    drafted: list[int]
    # Each consistency student's weight, in `cons`' order (training.guessed_weight); None: every student weighs 1.
    cons_weight: list[float] | None = None

    def __len__(self) -> int:
        return len(self.ids)


def blocks_row(ex: PackedExample, span: int = 0) -> PackedRow:
    """The paper's layout: `[prompt][N_0][C_0][N_1][C_1]...`, every noisy block whole beside its clean copy."""
    kind, block, copy = layout(len(ex.prompt), ex.n, ex.num_blocks, ex.total_length, ex.copies)
    ar, cons = loss_positions(ex, span)
    positions = ex.position_ids()
    return PackedRow(
        ex.input_ids(), positions, kind, block, copy, torch.tensor(positions), ar, cons, draft_positions(ex, span)
    )


def collate(
    examples: Sequence[PackedExample],
    pad_token_id: int,
    variant: str = "shipped",
    *,
    dense_mask: bool = True,
    span: int = 0,
    row: Callable[[PackedExample, int], PackedRow] = blocks_row,
) -> dict[str, torch.Tensor]:
    """A padded batch with its loss positions and layout; the dense [B, 1, L, L] mask only when `dense_mask` (the
    FlexAttention path builds a BlockMask from the layout instead of materialising B x L x L). `span`
    (training.draft_span): the consistency loss and the draft gate on each noisy block's first `span` positions
    from its first departure (0: all of them). `row`: the layout each example is packed in (`blocks_row`, or
    spans.py's `spans_row`)."""
    rows = [row(e, span) for e in examples]
    width = max(len(r) for r in rows)
    batch = len(examples)
    ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    pos = torch.zeros((batch, width), dtype=torch.long)
    kind = torch.full((batch, width), PAD, dtype=torch.long)
    block = torch.full((batch, width), -1, dtype=torch.long)
    copy = torch.zeros((batch, width), dtype=torch.long)
    anchor = torch.zeros((batch, width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r.ids)
        pos[b, : len(r)] = torch.tensor(r.positions)
        for dest, src in ((kind, r.kind), (block, r.block), (copy, r.copy), (anchor, r.anchor)):
            dest[b, : len(r)] = src[: len(r)]
    k_ar = max(1, max(len(r.ar) for r in rows))
    k_cons = max(1, max(len(r.cons) for r in rows))
    ar_src = torch.zeros((batch, k_ar), dtype=torch.long)
    ar_tgt = torch.full((batch, k_ar), -100, dtype=torch.long)
    student = torch.zeros((batch, k_cons), dtype=torch.long)
    teacher = torch.zeros((batch, k_cons), dtype=torch.long)
    hard = torch.full((batch, k_cons), -100, dtype=torch.long)
    cons_valid = torch.zeros((batch, k_cons), dtype=torch.bool)
    weighed = any(r.cons_weight is not None for r in rows)
    cons_weight = torch.ones((batch, k_cons), dtype=torch.float32)
    for b, r in enumerate(rows):
        if r.ar:
            ar_src[b, : len(r.ar)] = torch.tensor([s for s, _ in r.ar])
            ar_tgt[b, : len(r.ar)] = torch.tensor([t for _, t in r.ar])
        if r.cons:
            student[b, : len(r.cons)] = torch.tensor([s for s, _, _ in r.cons])
            teacher[b, : len(r.cons)] = torch.tensor([t for _, t, _ in r.cons])
            hard[b, : len(r.cons)] = torch.tensor([h for _, _, h in r.cons])
            cons_valid[b, : len(r.cons)] = True
            if r.cons_weight is not None:
                cons_weight[b, : len(r.cons)] = torch.tensor(r.cons_weight)
    out = {
        "input_ids": ids,
        "position_ids": pos,
        "layout_kind": kind,
        "layout_block": block,
        "layout_copy": copy,
        "layout_anchor": anchor,
        "ar_src": ar_src,
        "ar_tgt": ar_tgt,
        "cons_student": student,
        "cons_teacher": teacher,
        "cons_hard": hard,
        "cons_valid": cons_valid,
        "noisy_tokens": ((kind == NOISY) | (kind == SPAN)).sum(),
        "packed_tokens": (kind != PAD).sum(),  # what a step trained on: the rows' tokens, padding left out
        "draft_gate": draft_gate([r.drafted for r in rows], width),  # read only by an adapter
    }
    if weighed:
        out["cons_weight"] = cons_weight  # read by the consistency loss (losses.py); absent, every student weighs 1
    if dense_mask:
        out["attention_mask"] = build_mask(kind, block, variant, copy, anchor)
    return out
