"""The proposers' protocol (jf_core/decoding/proposers/): the decoders run whatever proposers they hold, in the
registry's order, and nothing a proposer proposes reaches the text unverified."""

from __future__ import annotations

from jf_core.decoding.common import StopTokens
from jf_core.decoding.layout import Layout
from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
from jf_core.decoding.proposers import (
    REGISTERED,
    AdapterChain,
    PromptLookup,
    Proposer,
    Recycling,
    Room,
    SuffixDraft,
    proposers_for,
)
from tests.conftest import PAD
from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference


def test_the_config_turns_proposers_on_in_the_registrys_order(tiny_model):
    assert (Recycling, PromptLookup, SuffixDraft, AdapterChain) == REGISTERED
    assert proposers_for(tiny_model, JFDecodeConfig(pool_size=0)) == []
    both = proposers_for(tiny_model, JFDecodeConfig(pool_size=2, lookup=8))
    assert [type(p) for p in both] == [Recycling, PromptLookup]


class Wrong(Proposer):
    """A proposer written in this test alone: a branch of tokens the model never picks, and seeds of them. The
    decoder takes it as it takes the registered ones."""

    name = "wrong"

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        start = len(lay.tokens)
        branch = [0, *range(start, start + room.run - 1)]
        return Layout(lay.tokens + [1] * (room.run - 1), [*lay.branches, branch], lay.drafts, [*lay.owners, self.name])

    def seed(self, seq, context, length):
        return [2] * length


def test_a_proposer_of_nonsense_changes_no_token(tiny_model):
    ps = prompts(3, seed=2)
    cfg = JFDecodeConfig(block_size=8, num_blocks=2, pool_size=2, lookup=8, max_new_tokens=MAX_NEW)
    decoder = JFDecoder(tiny_model, cfg, stop=StopTokens(None, PAD))
    decoder.proposers.insert(0, Wrong())  # ahead of the registered ones: its seeds win every fresh draft
    assert decoder.decode(ps).sequences == [reference(tiny_model, p, MAX_NEW, None) for p in ps]
