"""Layouts: a proposer's guess runs through the slots that already carry its prefix, and a branch that shares them
is verified exactly as if it were laid out alone."""

from __future__ import annotations

import torch

from jf_core.decoding.layout import (
    DRAFT_CHAIN,
    Layout,
    slot_outcomes,
    tree_positions_and_mask,
    winner,
    with_guess,
)
from tests.jf_core.decoding.test_kv import build


def _window(tokens: list[int]) -> Layout:
    return Layout(list(tokens), [list(range(len(tokens)))])


def test_a_guess_runs_through_the_slots_of_the_branch_that_carries_its_longest_prefix():
    window = [10, 11, 12, 13]
    lay = with_guess(_window(window), window, 4, [11, 20, 21], "lookup")  # the window carries its first token
    assert lay.branches[1] == [0, 1, 4, 5] and lay.tokens == [10, 11, 12, 13, 20, 21]
    # The corpus's guess agrees with the lookup's for two tokens, the window's for one: it hangs off the lookup's.
    lay = with_guess(lay, window, 4, [11, 20, 30, 31], "suffix")
    assert lay.branches[2] == [0, 1, 4, 6, 7] and lay.tokens[6:] == [30, 31] and lay.owners[2] == "suffix"
    assert with_guess(lay, window, 4, [11, 20], "suffix") is lay  # carried whole: nothing added
    # Past the window's run its drafts were not computed: no branch may hang off them.
    lay = with_guess(lay, window, 2, [11, 12, 40], "suffix")
    assert lay.branches[3] == [0, 1, 8, 9] and lay.tokens[8:] == [12, 40]
    lay = with_guess(lay, window, 4, [50], "lookup")  # no agreement: from the root
    assert lay.branches[4] == [0, 10]

    depth, mask = tree_positions_and_mask([lay], len(lay.tokens), "cpu")
    assert depth[0, 6].item() == 3 and depth[0, 7].item() == 4  # their depth in the corpus's branch
    assert mask[0, 7].nonzero().flatten().tolist() == [0, 1, 4, 6, 7]  # its ancestors, not the lookup's own tail


def test_a_branch_through_shared_slots_gets_the_logits_it_gets_laid_out_alone(tiny_model):
    """The same guesses in one forward, the second sharing the first's prefix or laid out apart: each branch's
    slots get the same logits (what its verification reads), with fewer slots run."""
    window, lookup, suffix = [5, 6, 7], [6, 8, 9], [6, 8, 14, 15]

    def logits(lay: Layout) -> torch.Tensor:
        kv, _ = build(tiny_model, [[3, 4, 5, 9, 2]])
        depth, mask = tree_positions_and_mask([lay], len(lay.tokens), "cpu")
        with torch.inference_mode():
            return kv.forward(torch.tensor([lay.tokens]), depth, mask)[0]

    first = with_guess(_window(window), window, 3, lookup, "lookup")
    shared = with_guess(first, window, 3, suffix, "suffix")
    end = len(first.tokens)
    apart = Layout(first.tokens + suffix[1:], [*first.branches, [0, 1, end, end + 1, end + 2]], [], shared.owners)
    assert len(shared.tokens) == len(apart.tokens) - 1  # the lookup's 8 is not laid out again
    got, want = logits(shared), logits(apart)
    for a, b in zip(shared.branches[2], apart.branches[2], strict=True):
        torch.testing.assert_close(got[a], want[b], rtol=1e-5, atol=1e-5)
    for i in first.branches[1]:
        torch.testing.assert_close(got[i], want[i], rtol=1e-5, atol=1e-5)


def test_each_slot_is_credited_to_who_laid_it_out_and_accepted_only_on_the_greedy_path():
    """`slot_outcomes`: the window's slots are the window's, a guess's own slots its proposer's (a shared prefix
    stays with the branch that laid it first), a draft chain's are never accepted; a slot is accepted where it lies
    on the winning branch's accepted prefix, so a wrong token stops its branch and everything under it."""
    window = [10, 11, 12, 13]
    lay = with_guess(_window(window), window, 4, [11, 20, 21], "lookup")  # slots 4, 5 through window slot 1
    lay = with_guess(lay, window, 4, [30, 31], "suffix")  # slots 6, 7 from the root
    lay = Layout([*lay.tokens, 99], lay.branches, [[3, 8]], lay.owners)  # a draft chain off window slot 3
    picks = [0] * len(lay.tokens)
    picks[0], picks[1], picks[4] = 11, 20, 77  # root -> 11 (window) -> 20 (lookup) -> not 21
    picks[6] = 31  # the suffix's 30 was never the pick after the root: its 31 is not accepted either
    assert slot_outcomes(lay, picks) == [
        ("window", 1, True), ("window", 2, False), ("window", 3, False),
        ("lookup", 2, True), ("lookup", 3, False),
        ("suffix", 1, False), ("suffix", 2, False),
        (DRAFT_CHAIN, 1, False),
    ]  # fmt: skip
    # A recycled candidate repeating the window's accepted token in a slot of its own earns nothing: the window won.
    twin = Layout([*lay.tokens, 11], [*lay.branches, [0, 9]], lay.drafts, [*lay.owners, "recycling"])
    assert slot_outcomes(twin, [*picks, 0])[-1] == ("recycling", 1, False)
    # Who won: the lookup (two slots past the root against the window's one), a tie keeping the earlier branch, and
    # no one where nothing past the root was accepted.
    assert winner(lay, picks) == ("lookup", [1, 4])
    assert winner(twin, [*picks, 0])[0] == "lookup"
    picks[4] = 21  # the lookup's guess accepted whole: still its win, with one slot more
    assert winner(lay, picks) == ("lookup", [1, 4, 5])
    picks[0] = 55  # the root's pick on no branch
    assert winner(lay, picks) == (None, [])
