"""The block recorder sees each block's initial draft first and its fixed point last, and the fixed points
concatenate to the greedy output."""

from __future__ import annotations

import functools
import itertools
import operator
from collections import defaultdict

import pytest

from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from tests.conftest import PAD


class Collect:
    def __init__(self) -> None:
        self.states: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
        self.fixed: dict[tuple[int, int], list[int]] = {}
        self.lengths: dict[tuple[int, int], int] = {}

    def block_state(self, sequence, block, state):
        self.states[(sequence, block)].append(state)

    def block_converged(self, sequence, block, fixed_point, length):
        self.fixed[(sequence, block)] = fixed_point
        self.lengths[(sequence, block)] = length


@pytest.mark.parametrize("block_size", [4, 16])
def test_trajectories_are_complete_and_unaliased(tiny_model, block_size):
    prompts = [[5, 6, 7, 8], [9, 10]]
    rec = Collect()
    cfg = JacobiConfig(block_size=block_size, max_new_tokens=4 * block_size, draft_init="random_vocab", seed=1)
    out = jacobi_decode(tiny_model, prompts, cfg, stop=StopTokens(None, PAD), recorder=rec)
    for seq, generated in enumerate(out.sequences):
        blocks = sorted(b for s, b in rec.fixed if s == seq)
        assert blocks == list(range(4))
        assert functools.reduce(operator.iadd, (rec.fixed[(seq, b)] for b in blocks), []) == generated
        for b in blocks:
            states = rec.states[(seq, b)]
            assert all(len(s) == block_size for s in states)
            assert states[-1] == rec.fixed[(seq, b)]
            assert states[0][0] == rec.fixed[(seq, b)][0]  # the block's first token is known-correct
            if block_size > 4:
                assert states[0] != states[-1]  # a random initial draft of 15 tokens is not the fixed point
            # each iteration changes the state (at least at the first mismatch), so no state repeats
            assert all(a != b for a, b in itertools.pairwise(states))
        # an initial state per block and one per forward, except the forward that confirms a fixed point (every
        # block has one but the last, which max_new_tokens may end before its confirmation)
        recorded = sum(len(rec.states[(seq, b)]) for b in blocks)
        forwards = len(out.stats.sequences[seq].accepted)
        assert forwards <= recorded <= forwards + 1


def test_initial_draft_is_recorded_before_being_overwritten(tiny_model):
    """Upstream's bug: the initial draft buffer is later written in place, so trajectory[0] ends up equal to the
    fixed point. Here states are fresh lists, so mutating the decoder's window cannot reach them."""
    rec = Collect()
    cfg = JacobiConfig(block_size=16, max_new_tokens=16, draft_init="random_vocab", seed=4)
    jacobi_decode(tiny_model, [[11, 12, 13]], cfg, stop=StopTokens(None, PAD), recorder=rec)
    states = rec.states[(0, 0)]
    assert len(states) >= 2
    assert states[0] != states[-1]


def test_block_ending_at_eos_converges_with_its_length(tiny_model):
    """The block holding EOS is recorded: fixed point through EOS, pad after it, and the valid length."""
    prompt = [21, 22, 23, 24]
    free = jacobi_decode(
        tiny_model, [prompt], JacobiConfig(block_size=8, max_new_tokens=40), stop=StopTokens(None, PAD)
    ).sequences[0]
    # EOS := the first token inside block 2 (tokens 16..22) that greedy has not produced before
    at = next(i for i in range(17, 23) if free[i] not in free[:i])
    eos = free[at]
    rec = Collect()
    cfg = JacobiConfig(block_size=8, max_new_tokens=40)
    out = jacobi_decode(tiny_model, [prompt], cfg, stop=StopTokens(eos, PAD), recorder=rec)
    assert out.sequences[0] == free[: at + 1]
    assert sorted(rec.fixed) == [(0, 0), (0, 1), (0, 2)]
    assert rec.lengths == {(0, 0): 8, (0, 1): 8, (0, 2): at - 15}
    assert rec.fixed[(0, 2)] == free[16 : at + 1] + [PAD] * (23 - at)
    assert rec.states[(0, 2)][-1] == rec.fixed[(0, 2)]
    got = [t for b in range(3) for t in rec.fixed[(0, b)][: rec.lengths[(0, b)]]]
    assert got == out.sequences[0]
