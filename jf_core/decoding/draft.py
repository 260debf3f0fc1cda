"""How a block's initial draft is filled. The first token of a block is always the known-correct one; these fill
the other n - 1 positions. Each sequence draws from its own generator, seeded by (seed, prompt), so drafts do not
depend on which other prompts share the batch."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal, Protocol

DraftInitName = Literal["prompt_sample", "repeat_last", "random_vocab"]


class DraftInit(Protocol):
    def __call__(self, context: Sequence[int], length: int, rng: random.Random) -> list[int]:
        """`context`: prompt + tokens known so far (the last is the block's first token)."""


def prompt_sample(context: Sequence[int], length: int, rng: random.Random) -> list[int]:
    """Upstream's choice: tokens drawn uniformly, with replacement, from the prompt and the text so far."""
    return rng.choices(context, k=length)


def repeat_last(context: Sequence[int], length: int, rng: random.Random) -> list[int]:
    return [context[-1]] * length


def random_vocab(vocab_size: int) -> DraftInit:
    def init(context: Sequence[int], length: int, rng: random.Random) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(length)]

    return init


def make_draft_init(name: DraftInitName, vocab_size: int) -> DraftInit:
    if name == "prompt_sample":
        return prompt_sample
    if name == "repeat_last":
        return repeat_last
    if name == "random_vocab":
        return random_vocab(vocab_size)
    raise ValueError(f"unknown draft_init {name!r}; expected prompt_sample, repeat_last or random_vocab")


def sequence_rng(seed: int, prompt: Sequence[int]) -> random.Random:
    return random.Random(f"{seed}:{','.join(map(str, prompt))}")
