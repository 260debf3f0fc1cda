"""The slot budget: at most `max_slots` slots a forward, the likeliest kept as a tree, and the output unchanged."""

from __future__ import annotations

import pytest

from jf_core.decoding import JFDecodeConfig, ar_decode
from jf_core.decoding.layout import Layout, slot_outcomes, with_guess
from jf_core.decoding.multiblock import JFDecoder
from jf_core.decoding.slot_budget import SlotBudget, kept_only
from jf_core.models import stop_tokens

PROMPTS = [
    "program: a=85; step -8; return f",
    "program: x=9; step *2; step -1; return z",
    "program: q=3; step +7; step *3; return q",
]


def _layout() -> Layout:
    window = [10, 11, 12, 13, 14]
    lay = Layout(list(window), [list(range(5))])
    lay = with_guess(lay, window, 5, [11, 20, 21, 22], "lookup")  # slots 5-7 under window slot 1
    return with_guess(lay, window, 5, [30, 31], "suffix")  # slots 8, 9 from the root


def test_the_budget_keeps_the_likeliest_slots_with_their_ancestors():
    budget = SlotBudget(max_slots=5)
    budget.seen.update({("lookup", 2): [10, 9], ("lookup", 3): [10, 8], ("window", 2): [10, 0], ("suffix", 1): [10, 1]})
    cut = budget.cut(_layout())
    # Worth (prior 0.5 ** depth, counting as two slots): the lookup's 20 (9 of 10) and 21 (8 of 10) first, each with
    # window slot 1 under them; then the suffix's 31 (its prior, 0.25) would need its parent 30 too: six slots, no
    # room; then the suffix's 30 (1 of 10 and the prior: 0.17) fits as the fifth. The window's slot 2 (0 of 10) and
    # the lookup's 22 (depth 4, the prior alone: 0.06) stay out.
    assert cut.tokens == [10, 11, 20, 21, 30]
    assert cut.branches == [[0, 1], [0, 1, 2, 3], [0, 4]] and cut.owners == ["window", "lookup", "suffix"]
    assert budget.cut(cut) is cut  # within the budget: unchanged


def test_a_draft_adapters_chain_is_kept_and_cut_to_the_window_kept():
    """The chain (never verified, so never counted) takes its slots first; the verified slots share the rest, and
    the chain is cut where the window is: its slot j reads window slot j."""
    lay = _layout()
    lay = Layout([*lay.tokens, 11, 12], lay.branches, [[0, 10, 11]], lay.owners)  # a 2-slot chain: window slots 1, 2
    budget = SlotBudget(max_slots=6)
    budget.seen.update({("lookup", 2): [10, 9], ("lookup", 3): [10, 8], ("window", 2): [10, 0], ("suffix", 1): [10, 1]})
    cut = budget.cut(lay)
    # Room for 4 verified slots: the lookup's 20 and 21 with window slot 1 under them. The window is cut to its root
    # and slot 1, so the chain keeps its first slot (window slot 1's copy) and drops the second.
    assert cut.tokens == [10, 11, 20, 21, 11]
    assert cut.branches == [[0, 1], [0, 1, 2, 3]] and cut.owners == ["window", "lookup"]
    assert cut.drafts == [[0, 4]]
    # Three slots: the chain keeps one at most, so that one verified slot fits: the likeliest slot that fits alone,
    # the window's slot 1 (never counted: its prior, 0.5; the lookup's 20 would need it too), and the chain's copy
    # of it. (The lookup's branch, cut to the window's slot 1, stays: it costs no slot.)
    tight = SlotBudget(max_slots=3, seen=budget.seen).cut(lay)
    assert tight.tokens == [10, 11, 11] and tight.branches == [[0, 1], [0, 1]] and tight.drafts == [[0, 2]]


def test_kept_only_cuts_every_branch_at_its_first_dropped_slot():
    lay = _layout()
    cut = kept_only(lay, {0, 1, 2, 5, 8})
    assert cut.tokens == [10, 11, 12, 20, 30]
    assert cut.branches == [[0, 1, 2], [0, 1, 3], [0, 4]] and cut.owners == ["window", "lookup", "suffix"]


def test_what_the_budget_learns_is_what_verification_accepted():
    lay = _layout()
    picks = [11, 20, 0, 0, 0, 21, 0, 0, 0, 0]  # the window's 11, then the lookup's 20 and 21, then a miss
    budget = SlotBudget(max_slots=4)
    budget.observe(lay, picks)
    accepted = {(o, d) for o, d, ok in slot_outcomes(lay, picks) if ok}
    assert accepted == {("window", 1), ("lookup", 2), ("lookup", 3)}
    assert budget.worth("lookup", 2) > budget.worth("window", 2)
    assert budget.cut(lay).tokens == [10, 11, 20, 21]


def test_max_slots_is_checked():
    with pytest.raises(ValueError, match="max_slots"):
        JFDecodeConfig(max_slots=1)
    assert "slots<=8" in JFDecodeConfig(max_slots=8).describe()


@pytest.mark.parametrize("max_slots", [2, 3, 6])
def test_a_budgeted_decode_is_greedy_ar_token_for_token(embedded, max_slots):
    """Every config that lays out branches (recycling, multi-block, prompt lookup, adaptive width) under a budget
    smaller than its layouts, at batch 1 and 3: the output is greedy AR's, and no forward ran past the budget."""
    model, tok = embedded
    stop = stop_tokens(model, tok)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    configs = [
        JFDecodeConfig(block_size=16, num_blocks=2, pool_size=2, lookup=8, max_new_tokens=48, max_slots=max_slots),
        JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, adaptive_width=True, max_new_tokens=48,
                       max_slots=max_slots),
    ]  # fmt: skip
    for prompts in (ids[:1], ids):
        reference = ar_decode(model, prompts, max_new_tokens=48, stop=stop).sequences
        for config in configs:
            decoder = JFDecoder(model, config, stop=stop)
            widths = []
            real = decoder._proposed
            decoder._proposed = lambda seq, real=real, widths=widths: (
                widths.append(len((lay := real(seq)).tokens)) or lay
            )
            assert decoder.decode(prompts).sequences == reference, config.describe()
            assert max(widths) <= max_slots


@pytest.mark.parametrize("max_slots", [3, 5])
def test_a_budgeted_decode_with_a_draft_adapter_is_greedy_ar_token_for_token(tiny_model, max_slots):
    """A chain beside prompt lookup's branch under a budget smaller than their layouts, the adapter far from zero
    (its drafts are not the base's): the output is the base's greedy AR, at batch 1 and 3, and no forward ran
    past the budget."""
    from tests.jf_core.test_draft_adapter import STOP, _prompts, _with_random_adapter

    drafted = _with_random_adapter(tiny_model)
    prompts = _prompts()
    for draft_span in (1, 2):
        config = JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, draft_span=draft_span,
                                max_new_tokens=40, max_slots=max_slots)  # fmt: skip
        for batch in (prompts[:1], prompts):
            reference = ar_decode(tiny_model, batch, max_new_tokens=40, stop=STOP).sequences
            decoder = JFDecoder(drafted, config, stop=STOP)
            laid: list[Layout] = []
            real = decoder._proposed
            decoder._proposed = lambda seq, real=real, laid=laid: laid.append(lay := real(seq)) or lay
            assert decoder.decode(batch).sequences == reference, config.describe()
            assert max(len(lay.tokens) for lay in laid) <= max_slots
            assert any(lay.drafts for lay in laid)  # the chain ran under the budget
