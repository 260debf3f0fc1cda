"""Longest-prefix greedy verification, the rule that makes Jacobi decoding lossless."""

from __future__ import annotations

from collections.abc import Sequence


def accepted_length(window: Sequence[int], greedy: Sequence[int]) -> int:
    """How many tokens of `window` are exactly what greedy AR would produce.

    `window[0]` is known to be correct; `greedy[i]` is the argmax after `window[: i + 1]`. Token i+1 is accepted
    while every token before it was accepted and it equals greedy[i]. Returns k in [1, len(window)]."""
    k = 1
    while k < len(window) and window[k] == greedy[k - 1]:
        k += 1
    return k
