"""Rejection recycling: the n-grams every forward left behind, verified again where they may fit.

Each forward's branches leave their greedy guesses, which become the next draft and, past the mismatch, replace the
rejected tail, so every draft the model made passes through here once. Those sequences are cut into n-grams keyed by
the token before them (`NgramPool`), so when a later window starts with a known-correct token t, the pool offers
continuations that once followed t. They ride as extra branches of the same forward, where a good one is accepted
for free and a bad one costs only its slots; with `seed_drafts` the newest one instead starts a fresh block's draft,
in the window's own slots, so on hardware where every extra slot costs compute (CPUs) recycling still pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jf_core.decoding.layout import Layout
from jf_core.decoding.proposers.base import Proposer, Room


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


@dataclass
class RecyclingMemory:
    pool: NgramPool
    seeded: int = 0  # fresh blocks whose draft started with a recycled n-gram


class Recycling(Proposer):
    name = "recycling"

    def __init__(self, pool_size: int, ngram: int, seed_drafts: bool, block_size: int) -> None:
        self.pool_size, self.ngram, self.seed_drafts, self.block_size = pool_size, ngram, seed_drafts, block_size

    @classmethod
    def from_config(cls, model, config) -> Recycling | None:
        """`config.pool_size` candidates a forward (0: none), of at most `config.ngram` tokens (0: n - 1), and with
        `config.seed_drafts` the seeds of fresh drafts."""
        pool_size, seed = getattr(config, "pool_size", 0), getattr(config, "seed_drafts", False)
        return cls(pool_size, config.ngram, seed, config.block_size) if pool_size or seed else None

    def begin(self, seq) -> RecyclingMemory:
        return RecyclingMemory(NgramPool(max(1, self.block_size - 1)))

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        """Candidates keyed by the window's known-correct first token, within the run and the real-active block
        (beyond it they would compete with pseudo-active drafts that condition on more context)."""
        if not self.pool_size or room.run <= 1:
            return lay
        reach = min(room.run, room.block_left) - 1
        span = min(reach, self.ngram) if self.ngram else reach
        tokens, branches, owners = list(lay.tokens), list(lay.branches), list(lay.owners)
        for cand in seq.memory[self.name].pool.candidates(seq.window[0], self.pool_size, span, seq.window[1:]):
            start = len(tokens)
            tokens += cand
            branches.append([0, *range(start, start + len(cand))])
            owners.append(self.name)
        return Layout(tokens, branches, lay.drafts, owners)

    def learn(self, seq, lay: Layout, greedy: list[int], branch: int, accepted: int) -> None:
        """Each branch's greedy guesses: the next forward's draft, and past the mismatch the replacement of a
        rejected tail. Drafts are harvested here, once, as they are made; fresh sampled drafts never are."""
        pool = seq.memory[self.name].pool
        for b in lay.branches:
            pool.add([lay.tokens[b[0]], *(greedy[i] for i in b)])

    def seed(self, seq, context: list[int], length: int) -> list[int]:
        if not self.seed_drafts:
            return []
        memory = seq.memory[self.name]
        found = next(iter(memory.pool.candidates(context[-1], 1, length)), [])
        memory.seeded += bool(found)
        return found
