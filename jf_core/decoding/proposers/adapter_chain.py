"""A draft adapter's chain (jf_core/draft_adapter/): the window's draft tokens again, computed in the same forward
by the adapter and never verified, whose picks are the window's next guesses. The weights that verify stay the
base's, so the adapter only decides how much of each window is right.

The chain covers the window slots whose guess is read: when the run is the whole window, the last slot's pick is
read only if every slot is accepted, and then it is the base's bonus token, so the chain stops one short (2n - 2
tokens a forward, not 2n - 1); `draft_span` cuts it shorter."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager

from jf_core.decoding.layout import Layout
from jf_core.decoding.proposers.base import Proposer, Room
from jf_core.draft_adapter.adapter import draft_adapter, draft_gate, drafted_slots, gated


class AdapterChain(Proposer):
    name = "adapter"

    def __init__(self, draft_span: int = 0) -> None:
        self.draft_span = draft_span

    @classmethod
    def from_config(cls, model, config) -> AdapterChain | None:
        """Whenever the model keeps an adapter and the config uses it (`config.draft_span` sizes its chain)."""
        return cls(config.draft_span) if draft_adapter(model) is not None and config.adapter else None

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        """The layout with the chain after whatever it holds: the window's draft tokens again, from its root."""
        main = lay.branches[0]
        span = len(main) - 1 - (len(main) == room.window)
        if self.draft_span:
            span = min(span, self.draft_span)
        if span < 1:
            return lay
        start = len(lay.tokens)
        tokens = lay.tokens + [lay.tokens[i] for i in main[1 : 1 + span]]
        return Layout(tokens, lay.branches, [[main[0], *range(start, start + span)]], lay.owners)

    def acting(self, model, layouts: list[Layout], width: int, device) -> ContextManager[None]:
        """For the forward: the adapter acts on the chains' drafted slots (their root is the window's, computed by
        the base), and nowhere else."""
        rows = [[i for chain in lay.drafts for i in drafted_slots(chain)] for lay in layouts]
        if not any(rows):
            # No chain in this forward (a window of one slot): the base's forward. A gate of zeros would still
            # run every delta on the packed path.
            return contextlib.nullcontext()
        return gated(model, draft_gate(rows, width, device))

    def guesses(self, lay: Layout, greedy: list[int], accepted: int) -> list[int]:
        """On the window past the accepted prefix, the chain's guesses where it reaches instead of the base's (they
        are only ever guesses there; the verified picks before them, and the slots past the chain, keep the
        base's)."""
        if not lay.drafts:
            return greedy
        out = list(greedy)
        # The chain's slot j copies window slot j; zip stops where the chain does.
        for main_slot, draft_slot in zip(lay.branches[0][accepted:], lay.drafts[0][accepted:], strict=False):
            out[main_slot] = greedy[draft_slot]
        return out
