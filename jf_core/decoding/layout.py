"""What a sequence puts into one forward (`Layout`): its window as a chain from the known-correct token, the
branches verified beside it (proposers': recycled candidates, a lookup's guess) and the draft chains computed but
never verified (a draft adapter's); and the relative positions and ancestor mask of such tree-shaped layouts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from jf_core.decoding.verify import common_prefix


@dataclass
class Layout:
    """A sequence's part of one forward: `tokens`, and `branches`, chains of indices into `tokens` that all start
    at index 0 (the known-correct token). Branch 0 is the window; others (a proposer's: recycled candidates, a
    lookup's guess) share its root and see only their own chain, so each is verified exactly as if it were the
    window. `owners` names who laid out each branch ("window", or a proposer's name)."""

    tokens: list[int]
    branches: list[list[int]]
    # Chains computed in the same forward but never verified: the draft adapter's, whose picks are the next guesses.
    drafts: list[list[int]] = field(default_factory=list)
    owners: list[str] = field(default_factory=lambda: ["window"])

    def __post_init__(self) -> None:
        if len(self.owners) != len(self.branches):
            raise ValueError(f"layout: {len(self.branches)} branches but {len(self.owners)} owners")


def with_guess(lay: Layout, window: list[int], run: int, guess: list[int], owner: str) -> Layout:
    """`lay` with `guess` (the tokens after the window's known-correct first) as one more branch, owned by `owner`.
    The branch runs through the slots of whichever branch already carries the guess's longest prefix (the window's
    drafts within its run, or an earlier proposer's guess) and only the rest costs slots (every slot costs compute
    on a CPU); a guess already carried whole adds nothing. Verification is unchanged: each shared slot sees the same
    ancestors at the same depth in either branch."""
    host, shared = 0, common_prefix(guess, window[1:run])
    for b, branch in enumerate(lay.branches[1:], start=1):
        agree = common_prefix(guess, [lay.tokens[i] for i in branch[1:]])
        if agree > shared:
            host, shared = b, agree
    if shared == len(guess):
        return lay
    start = len(lay.tokens)
    branch = [*lay.branches[host][: 1 + shared], *range(start, start + len(guess) - shared)]
    return Layout(lay.tokens + guess[shared:], [*lay.branches, branch], lay.drafts, [*lay.owners, owner])


DRAFT_CHAIN = "draft chain"  # `slot_outcomes`' owner of a draft adapter's chain slots (computed, never verified)


def slot_outcomes(lay: Layout, picks: list[int]) -> list[tuple[str, int, bool]]:
    """Each slot of `lay` past its root, in slot order: who laid it out (the first branch through it: "window" or a
    proposer's name; `DRAFT_CHAIN` for a draft adapter's chain), its depth in that chain, and whether verification
    accepted it: it lies on the winning branch's accepted prefix (each branch's tokens against the picks after its
    slots, the longest prefix winning and ties keeping the earlier branch, as the decoder verifies). A slot that
    duplicates the winner's token on another branch earns nothing: the accepted slots are a forward's accepted
    tokens past its known-correct first, what each slot earned for `jf bench cycle`."""
    laid: dict[int, tuple[str, int]] = {}
    for owner, chain in [*zip(lay.owners, lay.branches, strict=True), *((DRAFT_CHAIN, c) for c in lay.drafts)]:
        for depth, slot in enumerate(chain):
            laid.setdefault(slot, (owner, depth))
    accepted = set(winner(lay, picks)[1])
    return [(*laid[slot], slot in accepted) for slot in sorted(laid) if slot]


def winner(lay: Layout, picks: list[int]) -> tuple[str | None, list[int]]:
    """The owner of the branch verification keeps (None where no slot past the known-correct token was accepted)
    and its accepted slots past the root: the longest accepted prefix, ties keeping the earlier branch."""
    owner, won = None, []
    for name, branch in zip(lay.owners, lay.branches, strict=True):
        run = next((i for i, (a, b) in enumerate(itertools.pairwise(branch)) if picks[a] != lay.tokens[b]), None)
        path = branch[1:] if run is None else branch[1 : 1 + run]
        if len(path) > len(won):
            owner, won = name, path
    return owner, won


def tally_outcomes(counts: dict[tuple[str, int], list[int]], lay: Layout, picks: list[int]) -> None:
    """Add `lay`'s `slot_outcomes` to `counts` ((owner, depth) -> [slots laid out, slots accepted], a defaultdict):
    the one count the cycle clock reports and the slot budget learns from."""
    for owner, depth, accepted in slot_outcomes(lay, picks):
        count = counts[owner, depth]
        count[0] += 1
        count[1] += accepted


def tree_positions_and_mask(layouts: list[Layout], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative positions (depth in the chain) and the [B, W, W] ancestor mask of tree-shaped layouts; padding
    slots get neither (KVState lets them see themselves)."""
    rel = torch.zeros((len(layouts), width), dtype=torch.long)
    mask = torch.zeros((len(layouts), width, width), dtype=torch.bool)
    for row, lay in enumerate(layouts):
        for branch in lay.branches + lay.drafts:
            idx = torch.tensor(branch, dtype=torch.long)
            rel[row, idx] = torch.arange(len(branch))
            sub = torch.tril(torch.ones(len(branch), len(branch), dtype=torch.bool))
            mask[row, idx[:, None], idx[None, :]] |= sub
    return rel.to(device), mask.to(device)
