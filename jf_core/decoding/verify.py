"""Longest-prefix greedy verification, the rule that makes Jacobi decoding lossless."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens `a` and `b` share, in order."""
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


def accepted_length(window: Sequence[int], greedy: Sequence[int]) -> int:
    """How many tokens of `window` are exactly what greedy AR would produce.

    `window[0]` is known to be correct; `greedy[i]` is the argmax after `window[: i + 1]`. Token i+1 is accepted
    while every token before it was accepted and it equals greedy[i]. Returns k in [1, len(window)]."""
    k = 1
    while k < len(window) and window[k] == greedy[k - 1]:
        k += 1
    return k
