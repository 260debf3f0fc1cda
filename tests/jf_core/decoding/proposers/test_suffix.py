"""Suffix drafts (jf_core/decoding/proposers/suffix.py): the guess follows the corpus's most frequent continuation of
the text's longest matched tail; as a branch of the window's forward it is lossless whatever the corpus holds, and it
is verified and accepted where the corpus holds what the model writes; the corpus travels with the model directory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from jf_core.decoding.common import StopTokens
from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
from jf_core.decoding.proposers import SuffixDraft, proposers_for
from jf_core.decoding.proposers.suffix import (
    CORPUS_FILE,
    MAX_NGRAM,
    SuffixIndex,
    attach_corpus,
    draft_corpus,
    load_corpus,
    save_corpus,
)
from jf_core.models import ModelLoadError, load_model
from tests.conftest import PAD, VOCAB
from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference
from tests.jf_core.test_models import save_tiny


def test_the_longest_tail_picks_the_places_and_the_most_frequent_continuation_is_the_guess():
    index = SuffixIndex.of([[1, 2, 3, 4, 5], [9, 2, 3, 7, 8], [9, 2, 3, 7, 8], [6, 2, 3, 4, 6]])
    # [2, 3] occurs four times: 7 follows twice, 4 twice; [9, 2, 3] narrows it to the two that go on 7, 8.
    assert index.guess([9, 2, 3], max_ngram=3, length=4) == [7, 8]
    # With a 2-token tail every occurrence counts: 4 and 7 tie at half each; the first of the tied ids is taken
    # (4), then 5 and 6 split the two that said 4, and half is still enough for one more token.
    assert index.guess([0, 2, 3], max_ngram=3, length=4) == [4, 5]
    # No guess crosses a document's end, nor starts from a tail the corpus never holds.
    assert index.guess([4, 5], max_ngram=2, length=3) == []
    assert index.guess([3, 9], max_ngram=2, length=3) == []
    assert index.guess([7, 8], max_ngram=2, length=3) == []
    assert index.guess([5, 9, 2], max_ngram=2, length=3) == [3, 7, 8]
    # Ids beyond the corpus's, a one-token context and a zero length guess nothing.
    assert index.guess([2, 3000], max_ngram=2, length=3) == []
    assert index.guess([2], max_ngram=2, length=3) == []
    assert index.guess([2, 3], max_ngram=2, length=0) == []


def test_the_longest_tail_is_found_among_every_place_of_a_common_bigram():
    """[1, 2] ends 301 documents; only the first, the oldest, holds the context's longer tail [7, 8, 1, 2]. Its
    continuation is the guess, not the common one (a search among the latest places of the bigram alone would miss
    it), and the common one where no longer tail matches."""
    index = SuffixIndex.of([[7, 8, 1, 2, 50, 51], *([x, 1, 2, 60] for x in range(100, 400))])
    assert len(index) == 6 + 300 * 4
    n, places = index.tail([7, 8, 1, 2], max_ngram=8)
    assert n == 4 and places.tolist() == [4]  # in the array after the leading separator
    assert index.guess([7, 8, 1, 2], max_ngram=8, length=4) == [50, 51]
    # No longer than `factor` times the tail: a 4-token tail at 0.25 guesses one token, at 0.5 two.
    assert index.guess([7, 8, 1, 2], max_ngram=8, length=4, factor=0.25) == [50]
    assert index.guess([7, 8, 1, 2], max_ngram=8, length=4, factor=0.5) == [50, 51]
    assert index.guess([9, 1, 2], max_ngram=8, length=4) == [60]
    assert index.guess([7, 8, 1, 2], max_ngram=2, length=4) == [60]  # the tail held to two tokens
    assert index.tail([5, 1], max_ngram=8)[0] == 0 and index.tail([5, 1], max_ngram=8)[1].size == 0
    # The latest places of a common tail, in text order: the last of all of them.
    n, every = index.tail([9, 1, 2], max_ngram=8)
    assert n == 2 and every.size == 301 and (every[:-1] < every[1:]).all()
    assert index.tail([9, 1, 2], max_ngram=8, latest=10)[1].tolist() == every[-10:].tolist()
    assert index.tail([9, 1, 2], max_ngram=8, latest=400)[1].tolist() == every.tolist()


def test_a_continuation_shared_by_less_than_half_of_the_matches_ends_the_guess():
    index = SuffixIndex.of([[1, 2, 5], [1, 2, 6], [1, 2, 7], [1, 2, 5, 8], [1, 2, 5, 8]])
    # 5 is the pick of 3 of the 5 places, then 8 of 2 of the 3 that said 5: at least half each time ...
    assert index.guess([1, 2], max_ngram=2, length=3) == [5, 8]
    index = SuffixIndex.of([[1, 2, 5], [1, 2, 6], [1, 2, 7]])
    assert index.guess([1, 2], max_ngram=2, length=3) == []  # ... one of three is not
    assert index.guess([1, 2], max_ngram=2, length=3, share=0.3) == [5]  # ... unless a third is asked


def test_the_tree_lays_out_each_fork_the_matches_take_often_enough_likeliest_first():
    index = SuffixIndex.of([[1, 2, 3, 4, 5], [9, 2, 3, 7, 8], [9, 2, 3, 7, 8], [6, 2, 3, 4, 6]])
    # After [2, 3]: 7 and 4 at half each, then 8 (half), 5 and 6 (a quarter each): every node, as leaf paths.
    assert index.tree([0, 2, 3], max_ngram=3, length=4, nodes=8, prob=0.1) == [[7, 8], [4, 5], [4, 6]]
    # Best-first: the three likeliest nodes are 7, 4 and 8 (half each); 4's forks, a quarter each, are left out.
    assert index.tree([0, 2, 3], max_ngram=3, length=4, nodes=3, prob=0.1) == [[4], [7, 8]]
    assert index.tree([0, 2, 3], max_ngram=3, length=4, nodes=8, prob=0.3) == [[4], [7, 8]]
    # A longer tail narrows the matches (and the tree) as it narrows the chain; depth bounds hold as the chain's.
    assert index.tree([9, 2, 3], max_ngram=3, length=4, nodes=8, prob=0.1) == [[7, 8]]
    assert index.tree([0, 2, 3], max_ngram=3, length=1, nodes=8, prob=0.1) == [[4], [7]]
    assert index.tree([0, 2, 3], max_ngram=3, length=4, nodes=8, prob=0.1, factor=0.5) == [[4], [7]]
    assert index.tree([3, 9], max_ngram=2, length=3, nodes=8, prob=0.1) == []
    assert index.tree([0, 2, 3], max_ngram=3, length=4, nodes=0, prob=0.1) == []


def test_the_corpus_round_trips_through_the_model_directory_and_bad_ones_are_named(tmp_path):
    assert load_corpus(tmp_path) is None
    save_corpus([[5, 6, 7], [5, 6, 8, 9]], tmp_path)
    index = load_corpus(tmp_path)
    assert len(index) == 7 and index.guess([6, 8], 2, 4) == [9]  # its tokens, not the separators
    assert not [p for p in tmp_path.iterdir() if p.name != CORPUS_FILE]  # nothing left under a temporary name
    np.save(tmp_path / CORPUS_FILE, np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match=f"{CORPUS_FILE}.*flat array"):
        load_corpus(tmp_path)
    np.save(tmp_path / CORPUS_FILE, np.array([3, -4], dtype=np.int32))
    with pytest.raises(ValueError, match=f"{CORPUS_FILE}.*token ids"):
        load_corpus(tmp_path)


def test_load_model_attaches_the_directorys_corpus_and_names_a_bad_one(tmp_path):
    save_tiny(tmp_path)
    model, _ = load_model(str(tmp_path))
    assert draft_corpus(model) is None
    save_corpus([[5, 6, 7]], tmp_path)
    model, _ = load_model(str(tmp_path))
    assert draft_corpus(model).guess([5, 6], 2, 2) == [7]
    assert [type(p) for p in proposers_for(model, JFDecodeConfig(pool_size=0, suffix=4))] == [SuffixDraft]
    assert proposers_for(model, JFDecodeConfig(pool_size=0)) == []  # the corpus alone turns nothing on
    np.save(tmp_path / CORPUS_FILE, np.ones((1, 3), dtype=np.int32))
    with pytest.raises(ModelLoadError, match=CORPUS_FILE):
        load_model(str(tmp_path))


def test_bad_suffix_configs_are_named():
    with pytest.raises(ValueError, match="suffix"):
        JFDecodeConfig(suffix=-1)
    with pytest.raises(ValueError, match="suffix_ngram"):
        JFDecodeConfig(suffix=4, suffix_ngram=1)
    with pytest.raises(ValueError, match="suffix_ngram"):
        JFDecodeConfig(suffix=4, suffix_ngram=MAX_NGRAM + 1)  # deeper than the corpus's places are sorted
    assert "suffix=8" in JFDecodeConfig(suffix=8).describe()
    assert JFDecodeConfig(suffix_ngram=3, suffix_share=0.9, suffix_factor=2.0).canonical() == JFDecodeConfig()
    with pytest.raises(ValueError, match="suffix_factor"):
        JFDecodeConfig(suffix=4, suffix_factor=-1.0)
    with pytest.raises(ValueError, match="suffix_share"):
        JFDecodeConfig(suffix=4, suffix_share=0.0)
    with pytest.raises(ValueError, match="suffix_tree"):
        JFDecodeConfig(suffix=4, suffix_tree=-1)
    with pytest.raises(ValueError, match="suffix_tree_prob"):
        JFDecodeConfig(suffix=4, suffix_tree=4, suffix_tree_prob=0.0)
    assert "tree=10@0.1" in JFDecodeConfig(suffix=8, suffix_tree=10).describe()
    # A chain reads no tree floor, a tree no chain share: configs differing only there decode alike.
    assert JFDecodeConfig(suffix=8, suffix_tree_prob=0.5).canonical() == JFDecodeConfig(suffix=8).canonical()
    tree = JFDecodeConfig(suffix=8, suffix_tree=10)
    assert replace(tree, suffix_share=0.9).canonical() == tree.canonical() != JFDecodeConfig(suffix=8).canonical()


def _decode_with(model, corpus, cfg, ps, batch):
    """Every prompt decoded with `corpus` attached, `batch` at a time; the sequences' states kept for their wins."""
    attach_corpus(model, corpus)
    try:
        outputs, seqs = [], []
        for start in range(0, len(ps), batch):
            decoder = JFDecoder(model, cfg, stop=StopTokens(None, PAD))
            new = decoder.new_sequence
            decoder.new_sequence = lambda i, p, new=new: seqs.append(new(i, p)) or seqs[-1]
            outputs += decoder.decode(ps[start : start + batch]).sequences
        return outputs, seqs
    finally:
        attach_corpus(model, None)


@pytest.mark.parametrize(
    ("n", "k", "pool", "lookup", "tree"), [(4, 1, 0, 0, 0), (8, 2, 2, 8, 0), (16, 1, 0, 16, 0), (8, 2, 2, 8, 6)]
)
@pytest.mark.parametrize("batch", [1, 4])
def test_suffix_drafts_are_lossless_and_won_where_the_corpus_holds_the_models_text(
    tiny_model, n, k, pool, lookup, tree, batch
):
    """The corpus holds the model's own answers to these prompts (the best case: its guesses are right) and random
    text (the worst: they are wrong); the outputs are greedy AR's either way, and the first corpus's branch wins."""
    ps = prompts(4, seed=11)
    want = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    cfg = JFDecodeConfig(
        block_size=n, num_blocks=k, pool_size=pool, lookup=lookup, suffix=n, suffix_tree=tree, max_new_tokens=MAX_NEW
    )
    outputs, seqs = _decode_with(tiny_model, SuffixIndex.of(want), cfg, ps, batch)
    assert outputs == want
    assert sum(s.wins["suffix"] for s in seqs) > 0
    noise = np.random.default_rng(0).integers(3, VOCAB, size=(64, 16)).tolist()
    outputs, _ = _decode_with(tiny_model, SuffixIndex.of(noise), cfg, ps, batch)
    assert outputs == want


@pytest.mark.parametrize("batch", [1, 3])
def test_where_the_corpus_forks_away_from_the_models_text_the_tree_still_lays_it_out(tiny_model, batch):
    """Each of the model's answers is in the corpus once, beside two copies of it that fork after its tenth token
    into text of their own: there the chain follows the copies (two of the three matches) and is wrong, while the
    tree lays out the model's side too (a third of them) and verification accepts it. Wherever one match is left
    the two lay out the same path. Lossless either way, and more tokens a forward with the tree."""
    ps = prompts(3, seed=5)
    want = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    rng = np.random.default_rng(1)
    forked = [a[:10] + rng.integers(3, VOCAB, size=len(a) - 10).tolist() for a in want]
    corpus = SuffixIndex.of([*want, *forked, *forked])
    tpf = {}
    for tree in (0, 64):
        cfg = JFDecodeConfig(block_size=16, num_blocks=1, pool_size=0, suffix=16, suffix_tree=tree,
                             suffix_factor=0.0, max_new_tokens=MAX_NEW)  # fmt: skip
        outputs, seqs = _decode_with(tiny_model, corpus, cfg, ps, batch)
        assert outputs == want
        tpf[tree] = sum(len(o) for o in outputs) / sum(s.stats.forwards for s in seqs)
    assert tpf[64] > tpf[0], tpf
