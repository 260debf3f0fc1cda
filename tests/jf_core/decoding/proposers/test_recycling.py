"""Rejection recycling (jf_core/decoding/proposers/recycling.py): the pool keys continuations by the token before
them; the proposer verifies them as branches within the run and the real-active block, learns every branch's
guesses, and seeds a fresh draft from the pool."""

from __future__ import annotations

from jf_core.decoding.common import StopTokens
from jf_core.decoding.layout import Layout
from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
from jf_core.decoding.proposers import Recycling, Room
from jf_core.decoding.proposers.recycling import NgramPool
from tests.conftest import PAD


def test_ngram_pool_keys_continuations_by_the_token_before_them():
    pool = NgramPool(ngram=3, per_key=2)
    pool.add([1, 2, 3, 4, 5])
    assert pool.candidates(1, limit=4, length=3) == [[2, 3, 4]]
    assert pool.candidates(2, limit=4, length=2) == [[3, 4]]
    assert pool.candidates(1, limit=4, length=3, exclude=[2, 3, 4]) == []
    pool.add([1, 7, 8, 9])
    pool.add([1, 6, 6, 6])
    assert pool.candidates(1, limit=4, length=3) == [[6, 6, 6], [7, 8, 9]]  # newest first, per_key kept


def _sequence(tiny_model, **cfg):
    decoder = JFDecoder(tiny_model, JFDecodeConfig(block_size=8, max_new_tokens=32, **cfg), stop=StopTokens(None, PAD))
    (recycling,) = decoder.proposers
    return recycling, decoder.new_sequence(0, [3, 4, 5])


def test_what_a_forward_guessed_comes_back_as_a_branch_held_to_the_run_and_the_block(tiny_model):
    recycling, seq = _sequence(tiny_model, pool_size=2)
    seq.window = [1, 20, 21, 22, 23]
    window = Layout(seq.window[:4], [[0, 1, 2, 3]])
    recycling.learn(seq, window, [2, 3, 4, 5], branch=0, accepted=1)  # the forward's picks after 1: 2, 3, 4, 5
    lay = recycling.extend(seq, window, Room(run=4, window=5, block_left=3))
    # Keyed by the window's first token (1): the guesses 2, 3 (as far as the block's end, 3 - 1 slots after the root).
    assert lay.owners == ["window", "recycling"] and lay.branches[1] == [0, 4, 5]
    assert lay.tokens[4:] == [2, 3]
    assert recycling.extend(seq, window, Room(run=1, window=5, block_left=3)) is window  # a one-slot run: none


def test_a_fresh_draft_starts_with_the_pools_newest_continuation(tiny_model):
    recycling, seq = _sequence(tiny_model, pool_size=0, seed_drafts=True)
    assert recycling.extend(seq, Layout([1, 2], [[0, 1]]), Room(2, 2, 2)).owners == ["window"]  # seeds only
    assert recycling.seed(seq, [9, 1], length=3) == []  # nothing learnt yet
    recycling.learn(seq, Layout([1, 7], [[0, 1]]), [8, 9], branch=0, accepted=1)  # 1 -> 8 9
    assert recycling.seed(seq, [9, 1], length=3) == [8, 9]
    assert seq.memory["recycling"].seeded == 1


def test_it_is_off_unless_the_config_asks_for_it(tiny_model):
    assert Recycling.from_config(tiny_model, JFDecodeConfig(pool_size=0)) is None
    assert Recycling.from_config(tiny_model, JFDecodeConfig(pool_size=0, seed_drafts=True)) is not None
