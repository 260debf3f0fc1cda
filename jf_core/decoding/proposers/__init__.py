"""Who proposes tokens for a Jacobi window's forward, one file each (as vLLM's `v1/spec_decode/` keeps one proposer
per file): a draft adapter's chain (adapter_chain.py), prompt lookup (prompt_lookup.py), rejection recycling's
n-gram pool (recycling.py), suffix drafts from the model's corpus of earlier outputs (suffix.py). The decoders
(jacobi.py, multiblock.py) lay out the window, run the forward, verify every branch and settle the winner; they name
no proposer. With none, the window's next guesses are the forward's own picks, the Jacobi update itself.

A proposer may add to the layout (branches that are verified like the window, or draft chains that are computed and
never verified), change what the window's next guesses are read from, learn from what each forward accepted, and
seed a fresh block's draft. Nothing it proposes reaches the committed text unverified: verification is the
decoder's, against the base's own picks, so every proposer is lossless by construction.

Adding one: a file with its class (a `Proposer` built by `from_config` from the decode config's own fields, None
where they leave it off), its test, and one line in `REGISTERED` below.
"""

from __future__ import annotations

from jf_core.decoding.proposers.adapter_chain import AdapterChain
from jf_core.decoding.proposers.base import Proposer, Room
from jf_core.decoding.proposers.prompt_lookup import PromptLookup
from jf_core.decoding.proposers.recycling import Recycling
from jf_core.decoding.proposers.suffix import SuffixDraft

# In this order they extend a layout: branches first (recycled candidates, the lookup's guess, the corpus's guess,
# so a tie between them keeps the earlier one), the adapter's chain last (it copies the window, whatever else the
# layout holds).
REGISTERED: tuple[type[Proposer], ...] = (Recycling, PromptLookup, SuffixDraft, AdapterChain)


def proposers_for(model, config) -> list[Proposer]:
    """The proposers `config` turns on for `model`, in `REGISTERED`'s order."""
    return [p for cls in REGISTERED if (p := cls.from_config(model, config)) is not None]


__all__ = [
    "REGISTERED",
    "AdapterChain",
    "PromptLookup",
    "Proposer",
    "Recycling",
    "Room",
    "SuffixDraft",
    "proposers_for",
]
