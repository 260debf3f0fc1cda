"""Where the text already drafts (`training.guessed_weight`): how deep prompt lookup and the round's draft corpus
guess an answer from each root, so that the adapter's consistency loss can weigh less where their guesses would
win anyway.

A decoder with a draft adapter lays out the adapter's chain beside the text proposers' branches (prompt lookup over
the text so far, suffix drafts from the round's greedy answers), and verification keeps the longest accepted branch.
Where a text proposer guesses the next k tokens, an adapter draft of the same tokens earns nothing: on SmolLM2-135M
the adapter lifted the window's first slot from 10% to 22.5% accepted, but TPF only from 2.505 to 2.55, about two
thirds of its hits duplicating the text's (docs/real-models.md, 2026-12-06). A student at depth k from its root (the
token the forward fixes at its block's first departure) is *guessed* when one of the text proposers' branches
from that root holds the answer's next k tokens.

The corpus at decode time is every training answer; here each answer is guessed from the other fold's answers
only (two folds by a hash of the prompt id), so that no answer guesses itself: held-out questions never meet their
own answers in the corpus. A fold holds half the answers, which guesses a little less than the whole corpus does
(about 0.05 accepted tokens a position per doubling of the corpus, 2026-12-06).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from jf_core.decoding import JFDecodeConfig
from jf_core.decoding.proposers.prompt_lookup import PromptLookup
from jf_core.decoding.proposers.suffix import SuffixDraft, SuffixIndex
from jf_core.decoding.verify import common_prefix
from jf_core.training.packing import PackedExample

# The text proposers as the smollm2-135m tune lays them out (lookup 16, suffix 16 as a tree of 10), their other
# settings the decode config's defaults: the guesses a decoder of the trained model will actually make.
LOOKUP = 16
SUFFIX = 16
SUFFIX_TREE = 10


def answer(ex: PackedExample) -> list[int]:
    """The example's answer: its clean blocks through their valid lengths."""
    return [t for clean, length in zip(ex.clean, ex.lengths, strict=True) for t in clean[:length]]


def fold(prompt_id: str) -> int:
    """0 or 1, stable across processes and runs (Python's own str hash is salted per process)."""
    return hashlib.sha256(prompt_id.encode()).digest()[0] & 1


class TextGuesses:
    """`depth(ex, root)`: how many of the answer's tokens after `root` (an index into the answer) one branch of the
    text proposers guesses from the prompt and the answer through `root`; memoised per (prompt, root), each
    computed the first time a visit's span asks (a visit asks about three roots a block, not every position)."""

    def __init__(self, examples: Sequence[PackedExample], corpus: bool = True) -> None:
        d = JFDecodeConfig()
        self.lookup = PromptLookup(LOOKUP, d.lookup_ngram)
        folds: list[list[list[int]]] = [[], []]
        for ex in examples:
            folds[fold(ex.prompt_id)].append(answer(ex))

        def drafts(documents: list[list[int]]) -> SuffixDraft | None:
            if not corpus or not documents:
                return None
            index = SuffixIndex.of(documents)
            return SuffixDraft(
                index, SUFFIX, d.suffix_ngram, d.suffix_share, d.suffix_factor, SUFFIX_TREE, d.suffix_tree_prob
            )

        # An example of fold f is guessed from the other fold's answers.
        self.suffix = [drafts(folds[1 - f]) for f in (0, 1)]
        self._memo: dict[tuple[str, int], int] = {}

    def depth(self, ex: PackedExample, root: int) -> int:
        key = (ex.prompt_id, root)
        if key not in self._memo:
            self._memo[key] = self._depth(ex, root)
        return self._memo[key]

    def _depth(self, ex: PackedExample, root: int) -> int:
        text = answer(ex)
        context, truth = list(ex.prompt) + text[: root + 1], text[root + 1 :]
        branches = [self.lookup.guess(context, LOOKUP)]
        suffix = self.suffix[fold(ex.prompt_id)]
        if suffix is not None:
            branches += suffix.paths(context, SUFFIX)
        return max((common_prefix(branch, truth) for branch in branches), default=0)
