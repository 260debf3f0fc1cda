"""A cap on the slots one sequence's layout runs, the likeliest kept.

On a CPU a forward's cost is not linear in its width: SmolLM2-135M at batch 1 with 300 tokens of context cost 41.7
ms for 1 slot, 43.5 for 6, 48.0 for 8, 53 for 12 and 59.4 for 16 (2026-12-06, a 2-core AMD EPYC, fp32): up to about
six slots the weights' streaming hides the extra work, past it every slot costs about 1.5 ms, 0.036 of an AR step. The
proposers lay out what each finds worth trying (the window, a lookup's guess, the corpus's tree), and together they
ran 12.8 slots a forward where a slot past the ninth was accepted 3-5% of the time, below what it costs
(`jf bench cycle`'s slot table). The budget keeps at most `max_slots` slots (the root included) and drops the least
likely, learning how likely each is from the decode itself.

A slot's worth is how often slots laid out by the same owner at the same depth were accepted so far in this decode
(layout.py `slot_outcomes`, counted by `tally_outcomes`), starting from a prior that halves with depth; a slot
shared by several branches is worth its best. Slots are kept in the order of their worth, each with its ancestors (a
branch is a chain from the root), so what remains is a tree; dropping a slot drops what hangs below it. Verification
is unchanged, so the output is too: the budget trades only speed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from jf_core.decoding.layout import Layout, tally_outcomes


@dataclass
class SlotBudget:
    max_slots: int  # the root included
    # (owner, depth) -> [slots laid out, slots accepted] in this decode
    seen: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    prior_weight: float = 2.0  # the prior counts as this many slots laid out

    def __post_init__(self) -> None:
        if self.max_slots < 2:
            raise ValueError(
                f"max_slots must be >= 2 (the root and one slot; 0 turns the budget off), got {self.max_slots}"
            )

    def worth(self, owner: str, depth: int) -> float:
        """How often such a slot was accepted: the decode's count, with a prior of 0.5 ** depth."""
        laid, accepted = self.seen.get((owner, depth), (0, 0))
        return (accepted + self.prior_weight * 0.5**depth) / (laid + self.prior_weight)

    def observe(self, lay: Layout, picks: list[int]) -> None:
        """A verified forward's layout and the picks after its slots."""
        tally_outcomes(self.seen, lay, picks)

    def cut(self, lay: Layout) -> Layout:
        """`lay` with at most `max_slots` slots, the likeliest with their ancestors; `lay` itself where it fits.

        A draft adapter's chain (`lay.drafts`) is never verified, so no count says what its slots earn: it keeps
        its slots first (all but the root and one verified slot at most), and the verified slots share what is
        left. The chain's slot j reads window slot j's token and its pick becomes that slot's next guess
        (adapter_chain.py), so where the window is cut short the chain is cut to it."""
        if len(lay.tokens) <= self.max_slots:
            return lay
        span = max((len(draft) - 1 for draft in lay.drafts), default=0)
        span = min(span, (self.max_slots - 2) // max(len(lay.drafts), 1))
        room = self.max_slots - span * len(lay.drafts)
        parent: dict[int, int] = {}
        worth: dict[int, float] = {}
        for owner, branch in zip(lay.owners, lay.branches, strict=True):
            for depth, slot in enumerate(branch[1:], start=1):
                parent.setdefault(slot, branch[depth - 1])
                worth[slot] = max(worth.get(slot, 0.0), self.worth(owner, depth))
        kept = {0}
        for slot in sorted(worth, key=lambda s: (-worth[s], s)):
            path = []
            while slot not in kept:
                path.append(slot)
                slot = parent[slot]
            if len(kept) + len(path) <= room:
                kept.update(path)
            if len(kept) == room:
                break
        end = min(kept_prefix(lay.branches[0], kept), 1 + span)
        return kept_only(lay, kept | {slot for draft in lay.drafts for slot in draft[1:end]})


def kept_only(lay: Layout, kept: set[int]) -> Layout:
    """`lay` with only the `kept` slots (a tree: each with its parent), in their order: every branch and draft chain
    cut at its first slot not kept, a proposer's branch left with its root alone dropped (the window's stays), a
    chain left with its root alone dropped."""
    order = sorted(kept)
    index = {slot: i for i, slot in enumerate(order)}
    branches, owners = [], []
    for b, (owner, branch) in enumerate(zip(lay.owners, lay.branches, strict=True)):
        end = kept_prefix(branch, kept)
        if b == 0 or end > 1:
            branches.append([index[slot] for slot in branch[:end]])
            owners.append(owner)
    drafts = [[index[slot] for slot in draft[:end]] for draft in lay.drafts if (end := kept_prefix(draft, kept)) > 1]
    return Layout([lay.tokens[slot] for slot in order], branches, drafts, owners)


def kept_prefix(chain: list[int], kept: set[int]) -> int:
    """How many of `chain`'s first slots are `kept`."""
    return next((d for d, slot in enumerate(chain) if slot not in kept), len(chain))
