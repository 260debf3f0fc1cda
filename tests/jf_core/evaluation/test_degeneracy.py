"""The output figures the gate reads: repeated n-grams, mean length, outputs cut at the token limit."""

from __future__ import annotations

import pytest

from jf_core.evaluation.degeneracy import output_stats, repeated_ngrams


def test_repeated_ngrams_count_from_the_second_occurrence():
    assert repeated_ngrams([1, 2, 3, 4, 5], 2) == (0, 4)
    assert repeated_ngrams([7, 8, 7, 8, 7, 8], 2) == (3, 5)  # (7,8) x3, (8,7) x2: 5 n-grams, 2 distinct
    assert repeated_ngrams([1, 2], 4) == (0, 0)


def test_output_stats_pool_ngrams_and_tell_a_stop_at_the_limit_from_a_cut():
    eos = 9
    outputs = [[1, 2, 3, 9], [5, 5, 5, 5], [1, 2, 9]]
    stats = output_stats(outputs, max_new_tokens=4, stop_ids=[eos], n=2)
    # n-grams: 3 + 3 + 2 = 8; repeats only in [5, 5, 5, 5]: (5,5) x3 -> 2 repeated
    assert stats["repetition"] == pytest.approx(2 / 8)
    assert stats["mean_length"] == pytest.approx(11 / 3)
    assert stats["truncated"] == pytest.approx(1 / 3)  # [1,2,3,9] ends on EOS at the limit: not cut


def test_no_outputs_give_zeros():
    assert output_stats([], 8, [1]) == {"repetition": 0.0, "mean_length": 0.0, "truncated": 0.0}
