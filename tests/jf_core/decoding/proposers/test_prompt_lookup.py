"""Prompt lookup (jf_core/decoding/proposers/prompt_lookup.py): the guess is what followed the latest earlier
occurrence of the text's longest matching tail; as a branch of the window's forward it is lossless, and it is
actually verified and accepted where the text repeats itself."""

from __future__ import annotations

import pytest

from jf_core.decoding.common import StopTokens
from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
from jf_core.decoding.proposers.prompt_lookup import prompt_lookup
from tests.conftest import PAD
from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference


def test_the_longest_tail_that_occurred_earlier_decides_and_its_latest_occurrence_wins():
    # The tail [3, 4] occurred at 2 and 6; the latest (6) is followed by 9, 1.
    assert prompt_lookup([1, 2, 3, 4, 5, 6, 3, 4, 9, 1, 3, 4], max_ngram=2, length=2) == [9, 1]
    # A 3-token tail [7, 3, 4] occurred only first: longer beats later.
    assert prompt_lookup([7, 3, 4, 5, 6, 3, 4, 9, 7, 3, 4], max_ngram=3, length=3) == [5, 6, 3]
    # No tail of 3 or 2 tokens occurred: the last token alone (latest: position 2, followed by 8).
    assert prompt_lookup([4, 1, 4, 8, 2, 3, 4], max_ngram=3, length=1) == [8]
    # The guess stops where the text does, and a tail that never occurred guesses nothing.
    assert prompt_lookup([5, 6, 5], max_ngram=2, length=4) == [6, 5]
    assert prompt_lookup([1, 2, 3], max_ngram=2, length=4) == []
    assert prompt_lookup([1, 1], max_ngram=2, length=0) == []


def test_bad_lookup_configs_are_named():
    with pytest.raises(ValueError, match="lookup"):
        JFDecodeConfig(lookup=-1)
    with pytest.raises(ValueError, match="lookup_ngram"):
        JFDecodeConfig(lookup=4, lookup_ngram=0)


@pytest.mark.parametrize(("n", "k", "pool"), [(4, 1, 0), (8, 2, 0), (16, 1, 2)])
@pytest.mark.parametrize("batch", [1, 4])
def test_prompt_lookup_is_lossless(tiny_model, n, k, pool, batch):
    ps = prompts(4, seed=5)
    cfg = JFDecodeConfig(block_size=n, num_blocks=k, pool_size=pool, lookup=n, max_new_tokens=MAX_NEW)
    got = []
    for start in range(0, len(ps), batch):
        got += JFDecoder(tiny_model, cfg, stop=StopTokens(None, PAD)).decode(ps[start : start + batch]).sequences
    assert got == [reference(tiny_model, p, MAX_NEW, None) for p in ps]


def test_where_the_answer_repeats_itself_the_lookup_branch_is_accepted(tiny_model):
    """A random tiny model falls into loops; a looping answer is what lookup guesses whole. Its branch wins
    forwards, and the text is still greedy AR's."""
    ps = prompts(4, seed=5)
    cfg = JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, max_new_tokens=MAX_NEW)
    decoder = JFDecoder(tiny_model, cfg, stop=StopTokens(None, PAD))
    seqs = [decoder.new_sequence(i, p) for i, p in enumerate(ps)]
    decoder.new_sequence = lambda i, p: seqs[i]  # keep handles on the sequences to read their counters
    out = decoder.decode(ps)
    assert out.sequences == [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    assert sum(s.wins["lookup"] for s in seqs) > 0
    assert sum(s.wins["recycling"] for s in seqs) == 0  # no pool: every branch that won was lookup's


def test_the_guess_reaches_past_an_adaptive_width_and_the_width_follows_the_window_alone(tiny_model):
    """Adaptive width sizes the window by what its drafts earn; the guess is held only to the block, so a forward
    can accept more tokens than its window ran. The width's estimate counts the window's own acceptance, so a won
    lookup does not widen it. Lossless throughout, at batch 1 and 4."""
    ps = prompts(4, seed=5)
    cfg = JFDecodeConfig(
        block_size=16, num_blocks=1, pool_size=0, lookup=16, max_new_tokens=MAX_NEW,
        adaptive_width=True, width_scale=1.0, width_margin=0, width_floor=2,
    )  # fmt: skip
    decoder = JFDecoder(tiny_model, cfg, stop=StopTokens(None, PAD))
    runs, observed = [], []
    settle = decoder.settle

    def recording_settle(seq, layout, greedy, branch, accepted):
        runs.append((len(layout.branches[0]), accepted, layout.owners[branch] == "lookup"))
        before = seq.width.estimate
        settle(seq, layout, greedy, branch, accepted)
        observed.append((before, seq.width.estimate, accepted))

    decoder.settle = recording_settle
    want = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    assert decoder.decode(ps).sequences == want
    assert any(won and accepted > run for run, accepted, won in runs)  # held to the run, accepted <= run
    decay = decoder.policy.decay
    for (run, accepted, won), (before, after, _) in zip(runs, observed, strict=True):
        if won and run > 1:  # the window alone accepted less than the branch that won
            assert after < (1 - decay) * before + decay * accepted
    one_by_one = [JFDecoder(tiny_model, cfg, stop=StopTokens(None, PAD)).decode([p]).sequences[0] for p in ps]
    assert one_by_one == want
