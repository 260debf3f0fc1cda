"""How degenerate a model's outputs are: the figures the promotion gate reads beside accuracy and TPF.

Rewarding tokens per forward invites outputs that are cheap to predict rather than right: a model that repeats
itself, or pads its answer up to the token limit, accepts many draft tokens a forward and inflates its length.
Three figures over an evaluation set's outputs catch that, each compared by the gate with the input model's:

- `repetition`: the fraction of an output's n-grams that repeat an earlier n-gram of the same output, pooled over
  the set (0 for outputs without repeats, near 1 for a model looping on one phrase);
- `mean_length`: new tokens per output;
- `truncated`: the fraction of outputs that hit `max_new_tokens` without a stop token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NGRAM = 4


def repeated_ngrams(tokens: Sequence[int], n: int = NGRAM) -> tuple[int, int]:
    """(repeated, total) n-grams of one output: an n-gram counts as repeated from its second occurrence on."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams)), len(grams)


def output_stats(
    sequences: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Iterable[int], n: int = NGRAM
) -> dict[str, float]:
    """The three figures of the module docstring for one method's outputs (new tokens, stop token included)."""
    stop = set(stop_ids)
    repeated = total = truncated = 0
    for seq in sequences:
        r, t = repeated_ngrams(seq, n)
        repeated, total = repeated + r, total + t
        truncated += len(seq) >= max_new_tokens and not (seq and seq[-1] in stop)
    count = max(1, len(sequences))
    return {
        "repetition": repeated / total if total else 0.0,
        "mean_length": sum(len(s) for s in sequences) / count,
        "truncated": truncated / count,
    }
