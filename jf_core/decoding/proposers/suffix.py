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

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from jf_core.atomic import atomic_path
from jf_core.decoding.proposers.base import TextGuess

CORPUS_FILE = "draft_corpus.npy"
SEPARATOR = -1  # between documents: no match or guess crosses it
# At most this many matches are followed (the latest ones): enough for the frequencies, bounded cost on a large corpus.
MAX_MATCHES = 256


def joined(documents: Iterable[Sequence[int]]) -> np.ndarray:
    """The documents as one array, each followed by `SEPARATOR`."""
    parts: list[int] = []
    for doc in documents:
        parts += [*doc, SEPARATOR]
    return np.array(parts, dtype=np.int64)


class SuffixIndex:
    """The corpus as one array of token ids (documents joined by `SEPARATOR`) and its bigrams sorted, so that the
    places a text's last two tokens occur are one binary search away; longer matches are found from there."""

    def __init__(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1:
            raise ValueError(f"draft corpus: a flat array of token ids, got shape {tokens.shape}")
        if tokens.size and tokens.min() < SEPARATOR:
            raise ValueError(f"draft corpus: token ids are >= 0 (and {SEPARATOR} separates documents)")
        # A separator at both ends: every walk backward or forward stops at one before leaving the array.
        self.tokens = np.concatenate([[SEPARATOR], tokens, [SEPARATOR]])
        self.base = int(self.tokens.max()) + 2
        first, second = self.tokens[:-1], self.tokens[1:]
        ok = (first != SEPARATOR) & (second != SEPARATOR)
        ends = np.flatnonzero(ok) + 1  # where each bigram's second token sits
        keys = first[ok] * self.base + second[ok]
        order = np.argsort(keys, kind="stable")  # stable: each key's places stay in text order (latest last)
        self.keys, self.ends = keys[order], ends[order]

    @classmethod
    def of(cls, documents: Iterable[Sequence[int]]) -> SuffixIndex:
        return cls(joined(documents))

    def __len__(self) -> int:
        return int(self.tokens.size - 2)

    def guess(self, context: Sequence[int], max_ngram: int, length: int, share: float = 0.5) -> list[int]:
        """Up to `length` tokens continuing `context` as the corpus does: among the places its longest matched tail
        (2 to `max_ngram` tokens) occurs, the most frequent next token, then the most frequent after that among the
        places that agreed, while a token is the pick of at least `share` of them; [] when no bigram matches.

        A lower share guesses longer and is right less often; every guessed token costs a slot of the forward."""
        if length < 1 or len(context) < 2 or max(context[-2:]) >= self.base - 1:
            return []
        key = context[-2] * self.base + context[-1]
        lo, hi = np.searchsorted(self.keys, [key, key + 1])
        if lo == hi:
            return []
        places = self.ends[max(lo, hi - MAX_MATCHES) : hi]
        # The longest tail: keep the places that also match one token further back while any do.
        for back in range(2, min(max_ngram, len(context))):
            longer = places[self.tokens[places - back] == context[-1 - back]]
            if longer.size == 0:
                break
            places = longer
        guess: list[int] = []
        for ahead in range(1, length + 1):
            following = self.tokens[places + ahead]
            values, counts = np.unique(following, return_counts=True)
            best = int(np.argmax(counts))
            if values[best] == SEPARATOR or counts[best] < share * places.size:
                break
            guess.append(int(values[best]))
            places = places[following == values[best]]
        return guess


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

    def __init__(self, index: SuffixIndex, length: int, ngram: int, share: float) -> None:
        self.index, self.length, self.ngram, self.share = index, length, ngram, share

    @classmethod
    def from_config(cls, model, config) -> SuffixDraft | None:
        """`config.suffix`: the longest guess (0: off), when the model keeps a corpus; `config.suffix_ngram`: the
        longest tail matched; `config.suffix_share`: how sure each guessed token must be."""
        length = getattr(config, "suffix", 0)
        index = draft_corpus(model)
        if not length or index is None or not len(index):
            return None
        return cls(index, length, config.suffix_ngram, config.suffix_share)

    def guess(self, context: list[int], length: int) -> list[int]:
        return self.index.guess(context, self.ngram, length, self.share)
