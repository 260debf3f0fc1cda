"""Suffix drafts: a guess read from a corpus of earlier outputs (SuffixDecoding, arXiv 2411.04975; vLLM's `suffix`
method). The text's last tokens are matched in the corpus (the longest match up to `suffix_ngram` tokens); among the
places that match, the guess follows the most frequent continuation token by token while its next token is the pick
of at least `suffix_share` of the matches that reached it. Prompt lookup copies the text itself; this copies what the
model wrote before for other requests (the round's own answers to its training prompts: their phrasing, their
formats). Like the lookup's, the guess is one more branch of the window's forward, verified by the base: lossless
whatever the corpus holds.

The corpus is the model's, kept beside its weights (`draft_corpus.npy`, read by `jf_core.models.load_model`) and
attached to the loaded model (`attach_corpus`), as a draft adapter is: a model without one never builds this
proposer.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from jf_core.atomic import atomic_path
from jf_core.decoding.proposers.base import TextGuess

CORPUS_FILE = "draft_corpus.npy"
SEPARATOR = -1  # between documents: no match or guess crosses it
# At most this many matches are followed (the latest ones): enough for the frequencies, bounded cost on a large corpus.
MAX_MATCHES = 256
# The longest tail a guess matches (`suffix_ngram` at most this): the depth the corpus's places are sorted to.
MAX_NGRAM = 16


def joined(documents: Iterable[Sequence[int]]) -> np.ndarray:
    """The documents as one array, each followed by `SEPARATOR`."""
    parts: list[int] = []
    for doc in documents:
        parts += [*doc, SEPARATOR]
    return np.array(parts, dtype=np.int64)


class SuffixIndex:
    """The corpus as one array of token ids (documents joined by `SEPARATOR`) and its places (each token) sorted by
    the text ending there read backward (the place's own token, then the one before it, up to `MAX_NGRAM`): the
    places a tail of a text occurs, however many, are one range, narrowed by one binary search a token, so the
    longest tail is found among all of them (a bigram index that followed only a bigram's latest places missed a
    longer tail among its earlier ones)."""

    def __init__(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1:
            raise ValueError(f"draft corpus: a flat array of token ids, got shape {tokens.shape}")
        if tokens.size and tokens.min() < SEPARATOR:
            raise ValueError(f"draft corpus: token ids are >= 0 (and {SEPARATOR} separates documents)")
        # A separator at both ends: every walk forward stops at one before leaving the array.
        self.tokens = np.concatenate([[SEPARATOR], tokens, [SEPARATOR]])
        places = np.flatnonzero(self.tokens != SEPARATOR)
        # Sorted by the token at the place, then the one before it, and so on (lexsort's last key is its first);
        # before index 0 a walk reads the leading separator, as it does at any document's start.
        back = [self.tokens[np.maximum(places - k, 0)] for k in range(MAX_NGRAM)]
        self.places = places[np.lexsort(back[::-1])]
        # The first two keys kept: every guess starts with a search over the whole corpus; deeper keys are read
        # from the tokens over the (narrower) range that matched so far.
        self.last, self.before = (self.tokens[np.maximum(self.places - k, 0)] for k in (0, 1))

    @classmethod
    def of(cls, documents: Iterable[Sequence[int]]) -> SuffixIndex:
        return cls(joined(documents))

    def __len__(self) -> int:
        return int(self.places.size)

    def tail(self, context: Sequence[int], max_ngram: int, latest: int | None = None) -> tuple[int, np.ndarray]:
        """(n, places): the longest tail of `context` the corpus holds (2 to `max_ngram` tokens, at most
        `MAX_NGRAM`) and the places where it ends, in text order (the `latest` of them, where given); (0, empty)
        when not even its last two occur."""
        none = (0, self.places[:0])
        if len(context) < 2:
            return none
        lo, hi = np.searchsorted(self.last, [context[-1], context[-1] + 1])
        a, b = np.searchsorted(self.before[lo:hi], [context[-2], context[-2] + 1])
        if a == b:
            return none
        lo, hi, n = lo + a, lo + b, 2
        for k in range(2, min(max_ngram, MAX_NGRAM, len(context))):
            keys = self.tokens[np.maximum(self.places[lo:hi] - k, 0)]
            a, b = np.searchsorted(keys, [context[-1 - k], context[-1 - k] + 1])
            if a == b:
                break
            lo, hi, n = lo + a, lo + b, n + 1
        places = self.places[lo:hi]
        if latest is not None and places.size > latest:
            # A common short tail ends at thousands of places: the latest are found without sorting them all.
            places = np.partition(places, places.size - latest)[-latest:]
        return n, np.sort(places)

    def guess(
        self, context: Sequence[int], max_ngram: int, length: int, share: float = 0.5, factor: float = 0.0
    ) -> list[int]:
        """Up to `length` tokens continuing `context` as the corpus does: among the latest `MAX_MATCHES` places its
        longest matched tail occurs, the most frequent next token, then the most frequent after that among the
        places that agreed, while a token is the pick of at least `share` of them, and no more than `factor` times
        the tail's length (0: no such bound); [] when no bigram matches.

        A lower share or a higher factor guesses longer and is right less often; every guessed token costs a slot
        of the forward. Without the factor a guess followed one earlier answer to its full length once the places
        narrowed to it (each next token then the pick of all of them)."""
        n, places = self.tail(context, max_ngram, latest=MAX_MATCHES)
        if factor:
            length = min(length, int(factor * n))
        guess: list[int] = []
        for ahead in range(1, length + 1):
            if places.size == 0:
                break
            following = self.tokens[places + ahead]
            values, counts = np.unique(following, return_counts=True)
            best = int(np.argmax(counts))
            if values[best] == SEPARATOR or counts[best] < share * places.size:
                break
            guess.append(int(values[best]))
            places = places[following == values[best]]
        return guess

    def tree(
        self, context: Sequence[int], max_ngram: int, length: int, nodes: int, prob: float, factor: float = 0.0
    ) -> list[list[int]]:
        """SuffixDecoding's speculation tree (its paper's section 4.2; vLLM's `suffix` with a tree): up to `nodes`
        continuations of `context`'s longest matched tail, taken best-first by the share of its latest
        `MAX_MATCHES` places that go on through them, while that share is at least `prob` (vLLM's
        `min_token_prob`), none deeper than `length` nor `factor` times the tail (0: no such bound). Returned as
        its root-to-leaf paths, the likeliest first; [] when no bigram matches.

        Where the corpus forks (a number, a name, one phrasing or another) the chain (`guess`) stops or bets on one
        side; the tree lays out both, and verification keeps whichever the model wrote. Every node costs a slot."""
        n, places = self.tail(context, max_ngram, latest=MAX_MATCHES)
        if factor:
            length = min(length, int(factor * n))
        if not places.size or length < 1 or nodes < 1:
            return []
        total = places.size
        kept: list[tuple[int, ...]] = []
        # (-share, order, path, places that go on through it): heapq pops the likeliest, ties in the order found.
        frontier = [(-1.0, 0, (), places)]
        order = 0
        while frontier and len(kept) < nodes:
            _, _, path, reached = heapq.heappop(frontier)
            if path:
                kept.append(path)
            if len(path) == length:
                continue
            following = self.tokens[reached + len(path) + 1]
            values, counts = np.unique(following, return_counts=True)
            for value, count in zip(values.tolist(), counts.tolist(), strict=True):
                if value != SEPARATOR and count >= prob * total:
                    order += 1
                    heapq.heappush(frontier, (-count / total, order, (*path, value), reached[following == value]))
        # A path is a leaf unless a longer kept path runs through it.
        inner = {path[:depth] for path in kept for depth in range(1, len(path))}
        return [list(path) for path in kept if path not in inner]


def save_corpus(documents: Iterable[Sequence[int]], model_dir: str | Path) -> Path:
    """The documents as the model directory's draft corpus (written under a temporary name, then renamed)."""
    path = Path(model_dir) / CORPUS_FILE
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, joined(documents).astype(np.int32))
    return path


def load_corpus(model_dir: str | Path) -> SuffixIndex | None:
    """The model directory's draft corpus, indexed; None where it keeps none."""
    path = Path(model_dir) / CORPUS_FILE
    if not path.is_file():
        return None
    try:
        return SuffixIndex(np.load(path, allow_pickle=False))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def attach_corpus(model, index: SuffixIndex | None) -> None:
    """Keep `index` with the model (None: drop it), where the proposer looks for it."""
    model.jf_draft_corpus = index


def draft_corpus(model) -> SuffixIndex | None:
    return getattr(model, "jf_draft_corpus", None)


class SuffixDraft(TextGuess):
    name = "suffix"

    def __init__(
        self,
        index: SuffixIndex,
        length: int,
        ngram: int,
        share: float,
        factor: float = 0.0,
        tree: int = 0,
        tree_prob: float = 0.1,
    ) -> None:
        self.index, self.length, self.ngram, self.share, self.factor = index, length, ngram, share, factor
        self.tree, self.tree_prob = tree, tree_prob

    @classmethod
    def from_config(cls, model, config) -> SuffixDraft | None:
        """`config.suffix`: the longest guess (0: off), when the model keeps a corpus; `config.suffix_ngram`: the
        longest tail matched; `config.suffix_share`: how sure each guessed token must be; `config.suffix_factor`:
        the longest guess as a multiple of the tail matched; `config.suffix_tree`: a tree of at most this many
        tokens instead of one chain (0: the chain), each reached by at least `config.suffix_tree_prob` of the
        matches."""
        length = getattr(config, "suffix", 0)
        index = draft_corpus(model)
        if not length or index is None or not len(index):
            return None
        return cls(
            index,
            length,
            config.suffix_ngram,
            config.suffix_share,
            config.suffix_factor,
            config.suffix_tree,
            config.suffix_tree_prob,
        )

    def guess(self, context: list[int], length: int) -> list[int]:
        return self.index.guess(context, self.ngram, length, self.share, self.factor)

    def paths(self, context: list[int], length: int) -> list[list[int]]:
        if not self.tree:
            return super().paths(context, length)
        return self.index.tree(context, self.ngram, length, self.tree, self.tree_prob, self.factor)
