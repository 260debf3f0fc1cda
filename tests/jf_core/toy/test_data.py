"""AR batches of the embedded task: every example of a small set is served, and a set too small says so."""

from __future__ import annotations

import itertools

import pytest

from jf_core.toy.data import ar_batches
from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import build_tokenizer


def test_a_set_smaller_than_the_shuffle_pool_still_yields_its_batches():
    tok = build_tokenizer()
    batches = list(itertools.islice(ar_batches(tok, make_split("train", 100), 32, seed=0), 6))  # 3 per epoch
    assert [b["input_ids"].shape[0] for b in batches] == [32] * 6
    assert all((b["labels"] != -100).any() for b in batches)


def test_fewer_examples_than_a_batch_is_refused_by_name():
    with pytest.raises(ValueError, match="batch_size=32"):
        next(ar_batches(build_tokenizer(), make_split("train", 10), 32, seed=0))
