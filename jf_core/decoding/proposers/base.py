"""The protocol every proposer follows (the package's docstring says what one is), with do-nothing defaults so a
proposer's file holds only what it does."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from jf_core.decoding.layout import Layout, with_guess


@dataclass(frozen=True)
class Room:
    """Where a proposer may place slots in the next forward of one sequence."""

    run: int  # window slots the forward runs (all of it, or through a draft EOS, or an adaptive width's limit)
    window: int  # the window's length (the slots past `run` keep their drafts)
    block_left: int  # positions from the window's first to the real-active block's end: branches stop there


class Proposer:
    """One way of proposing tokens. `name` keys its branches' wins (`SequenceState.wins`) and its per-sequence
    memory (`SequenceState.memory`)."""

    name: ClassVar[str]
    # A won branch of this proposer tells an adaptive width what the window's drafts earn (false: its guess earns by
    # its own length, and the width follows the window's own acceptance).
    speaks_for_the_window: ClassVar[bool] = True

    @classmethod
    def from_config(cls, model, config) -> Proposer | None:
        """The proposer `config` asks for (None: it is off, or `model` cannot host it)."""
        raise NotImplementedError

    def begin(self, seq) -> Any:
        """The memory this proposer keeps for a new sequence (`seq.memory[name]`); None: it keeps none."""
        return None

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        """The sequence's layout with this proposer's slots added."""
        return lay

    def acting(self, model, layouts: list[Layout], width: int, device) -> ContextManager[None]:
        """What must hold while the forward runs (a draft adapter's gate)."""
        return contextlib.nullcontext()

    def guesses(self, lay: Layout, greedy: list[int], accepted: int) -> list[int]:
        """The picks the decoder settles from: where this proposer's guesses replace the forward's own."""
        return greedy

    def learn(self, seq, lay: Layout, greedy: list[int], branch: int, accepted: int) -> None:
        """After verification, before the decoder settles: `branch` won with `accepted` tokens."""

    def seed(self, seq, context: list[int], length: int) -> list[int]:
        """The first tokens of a fresh block's draft of `length` after `context` ([]: the decoder's draft init)."""
        return []


class TextGuess(Proposer):
    """A proposer that guesses what follows the text so far (prompt, committed tokens and the window's known-correct
    first token), up to `length` tokens, as one more branch of the window's forward (`layout.with_guess`); a
    subclass says only how it guesses (`guess`)."""

    # Adaptive width sizes the window by what its drafts earn; a guess that continues the text earns by its own length.
    speaks_for_the_window: ClassVar[bool] = False
    length: int

    def guess(self, context: list[int], length: int) -> list[int]:
        raise NotImplementedError

    def paths(self, context: list[int], length: int) -> list[list[int]]:
        """The guesses laid out, each a branch (a tree's root-to-leaf paths, sharing their common prefixes' slots):
        by default the one `guess`."""
        return [self.guess(context, length)]

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        if room.run <= 1:
            return lay
        # The guess is not held to the run (it earns by its own length), only to the block's end.
        far = min(room.window, room.block_left) - 1
        for guess in self.paths(seq.prompt + seq.committed + seq.window[:1], min(far, self.length)):
            lay = with_guess(lay, seq.window, room.run, guess, self.name)
        return lay
