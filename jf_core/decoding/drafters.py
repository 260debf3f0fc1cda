"""Who proposes a Jacobi window's next guesses, one noun each (as vLLM's spec-decode proposers are): the model
itself (`SelfDrafter`: its picks past the accepted prefix are the guesses), or its draft adapter (`AdapterDrafter`:
a chain of the window's draft tokens again, computed in the same forward by the adapter and never verified). The
decoder verifies (jacobi.py); a drafter only adds to a layout, gates its slots and reads its guesses, so nothing it
proposes reaches the committed text unverified.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager

import torch

from jf_core.decoding.layout import Layout
from jf_core.draft_adapter.adapter import draft_adapter, draft_gate, drafted_slots, gated


class SelfDrafter:
    """The weights that verify also draft: the forward is the window alone and the guesses are its picks."""

    def extend(self, lay: Layout, window: int) -> Layout:
        return lay

    def acting(self, model, layouts: list[Layout], width: int, device) -> ContextManager[None]:
        return contextlib.nullcontext()

    def guesses(self, lay: Layout, greedy: list[int], accepted: int) -> list[int]:
        return greedy


class AdapterDrafter:
    """A draft adapter drafts apart from the weights that verify (jf_core/draft_adapter/). Its chain covers the
    window slots whose guess is read: when the run is the whole window, the last slot's pick is read only if every
    slot is accepted, and then it is the base's bonus token, so the chain stops one short (2n - 2 tokens a forward,
    not 2n - 1); `draft_span` cuts it shorter."""

    def __init__(self, draft_span: int = 0) -> None:
        self.draft_span = draft_span

    def extend(self, lay: Layout, window: int) -> Layout:
        """The layout with the chain after whatever it holds: the window's draft tokens again, from its root."""
        main = lay.branches[0]
        span = len(main) - 1 - (len(main) == window)
        if self.draft_span:
            span = min(span, self.draft_span)
        if span < 1:
            return lay
        start = len(lay.tokens)
        tokens = lay.tokens + [lay.tokens[i] for i in main[1 : 1 + span]]
        return Layout(tokens, lay.branches, [[main[0], *range(start, start + span)]])

    def acting(self, model, layouts: list[Layout], width: int, device) -> ContextManager[None]:
        """For the forward: the adapter acts on the chains' drafted slots (their root is the window's, computed by
        the base), and nowhere else."""
        rows = [[i for chain in lay.drafts for i in drafted_slots(chain)] for lay in layouts]
        return gated(model, draft_gate(rows, width, device))

    def guesses(self, lay: Layout, greedy: list[int], accepted: int) -> list[int]:
        """The picks settle() reads: on the window past the accepted prefix, the chain's guesses where it reaches
        instead of the base's (they are only ever guesses there; the verified picks before them, and the slots past
        the chain, keep the base's)."""
        if not lay.drafts:
            return greedy
        out = list(greedy)
        # The chain's slot j copies window slot j; zip stops where the chain does.
        for main_slot, draft_slot in zip(lay.branches[0][accepted:], lay.drafts[0][accepted:], strict=False):
            out[main_slot] = greedy[draft_slot]
        return out


def drafter_for(model: torch.nn.Module, config) -> SelfDrafter | AdapterDrafter:
    """The model's adapter drafts when it keeps one (`config.draft_span` sizes its chain); else the model itself."""
    return AdapterDrafter(config.draft_span) if draft_adapter(model) is not None else SelfDrafter()
