"""Prompt lookup: a draft that costs no forward. The text so far (prompt and committed tokens) is searched for an
earlier occurrence of its last few tokens; what followed that occurrence is the guess for what follows now. Answers
that copy their question (the numbers of a word problem, the identifiers of a function, a quoted passage) are
guessed this way long before a model would be. HF's prompt lookup and vLLM's n-gram proposer draft the same way;
here the guess is one more branch of the window's forward, verified by the base like any.
"""

from __future__ import annotations

from collections.abc import Sequence

from jf_core.decoding.proposers.base import TextGuess


def prompt_lookup(context: Sequence[int], max_ngram: int, length: int) -> list[int]:
    """Up to `length` tokens that followed the latest earlier occurrence of `context`'s last n tokens, for the
    longest n <= `max_ngram` that occurs; [] when none does.

    Longest first: a longer match is less often a coincidence. Latest first: the text just written predicts its
    own next words better than the prompt's first mention (HF takes the earliest; both are lossless)."""
    if length < 1:
        return []
    end = len(context)
    for n in range(min(max_ngram, end - 1), 0, -1):
        tail = list(context[end - n :])
        # Starts of earlier occurrences, latest first; an occurrence must leave at least one token after it.
        for start in range(end - n - 1, -1, -1):
            if context[start] == tail[0] and list(context[start : start + n]) == tail:
                return list(context[start + n : start + n + length])
    return []


class PromptLookup(TextGuess):
    name = "lookup"

    def __init__(self, length: int, ngram: int) -> None:
        self.length, self.ngram = length, ngram

    @classmethod
    def from_config(cls, model, config) -> PromptLookup | None:
        """`config.lookup`: the longest guess (0: off); `config.lookup_ngram`: the longest tail matched."""
        length = getattr(config, "lookup", 0)
        return cls(length, config.lookup_ngram) if length else None

    def guess(self, context: list[int], length: int) -> list[int]:
        return prompt_lookup(context, self.ngram, length)
