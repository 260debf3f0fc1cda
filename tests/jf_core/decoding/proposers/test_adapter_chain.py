"""A draft adapter's chain (jf_core/decoding/proposers/adapter_chain.py): how many of the window's slots it copies,
and where its picks replace the base's. Its losslessness and gate are tests/jf_core/test_draft_adapter.py's."""

from __future__ import annotations

from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.layout import Layout
from jf_core.decoding.proposers import AdapterChain, Room


def _window(n: int) -> Layout:
    return Layout(list(range(100, 100 + n)), [list(range(n))])


def test_the_chain_copies_the_slots_whose_guess_is_read():
    whole = AdapterChain().extend(None, _window(5), Room(run=5, window=5, block_left=5))
    assert whole.drafts == [[0, 5, 6, 7]]  # a whole window: its last slot's guess is never read (2n - 2 tokens)
    assert whole.tokens[5:] == [101, 102, 103]
    cut = AdapterChain().extend(None, _window(3), Room(run=3, window=5, block_left=5))
    assert cut.drafts == [[0, 3, 4]]  # a run short of the window: every slot after the root
    assert AdapterChain(draft_span=1).extend(None, _window(5), Room(5, 5, 5)).drafts == [[0, 5]]
    one = _window(1)
    assert AdapterChain().extend(None, one, Room(1, 1, 1)) is one


def test_its_picks_replace_the_bases_past_the_accepted_prefix_as_far_as_it_reaches():
    lay = AdapterChain(draft_span=2).extend(None, _window(5), Room(5, 5, 5))  # chain [0, 5, 6]
    picks = [10, 11, 12, 13, 14, 50, 60]  # the base's after slots 0-4, the adapter's after chain slots 5, 6
    assert AdapterChain().guesses(lay, picks, accepted=1) == [10, 50, 60, 13, 14, 50, 60]
    assert AdapterChain().guesses(lay, picks, accepted=3) == picks  # the chain reaches no slot past the prefix


def test_it_acts_only_where_the_model_keeps_an_adapter(tiny_model):
    assert AdapterChain.from_config(tiny_model, JacobiConfig()) is None
