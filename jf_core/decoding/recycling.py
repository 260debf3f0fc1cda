"""Rejection recycling's n-gram pool.

Every forward leaves tokens behind: each branch's greedy guesses, which become the next draft and, past the
mismatch, replace the rejected tail, so every draft the model made passes through here once. Those sequences are
cut into n-grams keyed by the token before them, so when a later window starts with a known-correct token t, the
pool offers continuations that once followed t. They are verified in the same forward as the window (extra
branches of the sequence's layout), where a good one is accepted for free and a bad one costs only its slots, or
they seed a fresh block's draft (multiblock.py).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramPool:
    def __init__(self, ngram: int, per_key: int = 8) -> None:
        if ngram < 1 or per_key < 1:
            raise ValueError(f"ngram and per_key must be >= 1, got {ngram}, {per_key}")
        self.ngram, self.per_key = ngram, per_key
        self._pool: dict[int, list[tuple[int, ...]]] = {}

    def add(self, tokens: Sequence[int]) -> None:
        """Harvest every position's continuation (up to `ngram` tokens, at least 2), newest first."""
        for i in range(len(tokens) - 2):
            gram = tuple(tokens[i + 1 : i + 1 + self.ngram])
            grams = self._pool.setdefault(tokens[i], [])
            if gram in grams:
                grams.remove(gram)
            grams.insert(0, gram)
            del grams[self.per_key :]

    def candidates(self, key: int, limit: int, length: int, exclude: Sequence[int] = ()) -> list[list[int]]:
        """Up to `limit` distinct continuations of `key`, cut to `length`, other than `exclude` (the window)."""
        out: list[list[int]] = []
        exclude = tuple(exclude[:length])
        for gram in self._pool.get(key, ()):
            cut = list(gram[:length])
            if tuple(cut) != exclude[: len(cut)] and cut not in out:
                out.append(cut)
                if len(out) == limit:
                    break
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())
