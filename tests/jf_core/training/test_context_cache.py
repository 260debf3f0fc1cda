"""A draft adapter's two-pass training forward (jf_core/training/context_cache.py) against the one packed forward."""

from __future__ import annotations

import contextlib

import pytest
import torch

from jf_core.training import context_cache as two_passes
from jf_core.training.context_cache import adapter_dependent, applies, read_by_losses
from jf_core.training.losses import JacobiForcingObjective, JFLossConfig, ar_term_kept
from jf_core.training.mask import CLEAN, NOISY, PROMPT
from jf_core.training.packing import PackedExample, collate
from tests.conftest import PAD, TINY_MODELS
from tests.jf_core.training.test_mask_packing_losses import _random_examples, adapter_model


def _examples(seed: int) -> list[PackedExample]:
    """Two examples of different prompt and answer lengths, so the rows differ in context and padding."""
    return _random_examples(seed, ((3, 3), (7, 2)))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("mask", ["clean_context", "shipped"])
@pytest.mark.parametrize("consistency", ["kl", "fixed_point"])
@pytest.mark.parametrize("span", [0, 1, 2])
def test_two_passes_give_the_one_packed_forwards_losses_and_gradients(arch, mask, consistency, span):
    """With a drafted span (training.draft_span) the second pass leaves out the positions no loss reads: the same
    losses and gradients still."""
    model, adapter = adapter_model(arch)
    batch = collate(_examples(0), PAD, mask, span=span)
    assert applies(model, batch)
    results = []
    for context_cache in (False, True):
        model.zero_grad(set_to_none=True)
        cfg = JFLossConfig(consistency=consistency, chunk=5)
        objective = JacobiForcingObjective(cfg, mask, context_cache=context_cache)
        loss, metrics = objective(model, batch)
        loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
        results.append((loss.detach(), metrics, grads))
    (loss_one, m_one, g_one), (loss_two, m_two, g_two) = results
    # The AR loss's positions (clean copies) depend on no drafted one: the two passes leave that term out (it has no
    # gradient), the one pass computes it; the rest of the loss, and every gradient, are the same.
    assert "ar_loss" not in m_two and m_one["ar_loss"] > 0
    torch.testing.assert_close(loss_two, loss_one - cfg.ar_weight * m_one["ar_loss"], rtol=1e-5, atol=1e-6)
    assert m_two["consistency_loss"] == pytest.approx(m_one["consistency_loss"], rel=1e-5, abs=1e-7)
    assert g_one.keys() == g_two.keys() and len(g_one) == 2 * len(adapter.b)  # the adapter's A and B, nothing else
    assert any(g.abs().sum() > 0 for g in g_one.values())
    for k in g_one:
        torch.testing.assert_close(g_two[k], g_one[k], rtol=1e-4, atol=1e-6)


def test_the_ar_term_kept_for_a_bench_is_computed_again_and_moves_no_gradient():
    """`ar_term_kept` (bench/train_throughput.py's `ar_cut` switch) times a step as it ran before the AR term was
    left out: the term is back in the loss and the history, and the adapter's gradients are the same."""
    model, _ = adapter_model("llama")
    batch = collate(_examples(2), PAD, "clean_context")
    objective = JacobiForcingObjective(JFLossConfig(chunk=5), "clean_context", context_cache=True)
    results = []
    for kept in (False, True):
        model.zero_grad(set_to_none=True)
        with ar_term_kept() if kept else contextlib.nullcontext():
            loss, metrics = objective(model, batch)
        loss.backward()
        results.append(
            (loss.detach(), metrics, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        )
    (loss_cut, m_cut, g_cut), (loss_kept, m_kept, g_kept) = results
    assert "ar_loss" not in m_cut and m_kept["ar_loss"] > 0
    torch.testing.assert_close(loss_kept, loss_cut + objective.cfg.ar_weight * m_kept["ar_loss"], rtol=1e-5, atol=1e-6)
    assert g_cut.keys() == g_kept.keys()
    for k in g_cut:
        torch.testing.assert_close(g_kept[k], g_cut[k], rtol=0, atol=0)
    assert "ar_loss" not in objective(model, batch)[1]  # the switch is back on after the block


def test_the_second_pass_holds_exactly_what_the_adapter_reaches():
    """Clean copies and the prompt never depend on the adapter; a noisy block's undrafted first token does only
    where it sees earlier drafted blocks (the shipped mask), not under the clean-context mask."""
    for mask in ("clean_context", "shipped"):
        batch = collate(_examples(1), PAD, mask)
        dependent = adapter_dependent(batch["attention_mask"], batch["draft_gate"])
        kind, block = batch["layout_kind"], batch["layout_block"]
        assert not dependent[(kind == PROMPT) | (kind == CLEAN)].any()
        drafted = batch["draft_gate"] > 0
        assert dependent[drafted].all()
        first_of_later_blocks = (kind == NOISY) & ~drafted & (block > 0)
        assert first_of_later_blocks.any()
        assert dependent[first_of_later_blocks].all() == (mask == "shipped")
        assert not dependent[(kind == NOISY) & ~drafted & (block == 0)].any()


def test_the_whole_model_training_and_flex_batches_take_the_one_pass():
    model, _ = adapter_model("qwen2")
    batch = collate(_examples(0), PAD, "clean_context")
    assert applies(model, batch)
    assert not applies(model, {k: v for k, v in batch.items() if k != "attention_mask"})  # FlexAttention's batches
    assert not applies(model, {**batch, "draft_gate": torch.zeros_like(batch["draft_gate"])})  # nothing drafted
    next(p for n, p in model.named_parameters() if not n.startswith("jf_draft_adapter.")).requires_grad_(True)
    assert not applies(model, batch)  # a base weight trains: its context positions carry gradients
    assert not applies(TINY_MODELS["qwen2"](), batch)  # no adapter


def test_a_one_slot_span_computes_one_position_a_block_with_autograd():
    """Under the clean-context mask with training.draft_span 1, each noisy block's first departure is the only
    position the adapter's pass computes: the positions past it depend on the adapter but no loss reads them."""
    model, _ = adapter_model("llama")
    example = _examples(2)[:1]
    widths = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        for span in (0, 1):
            batch = collate(example, PAD, "clean_context", span=span)
            widths.clear()
            _, dependent = two_passes.forward(model, batch)
            students = int(batch["cons_valid"].sum())
            if span == 1:
                assert widths[-1] == students == example[0].num_blocks  # one student a block, nothing else
                assert (dependent & ~read_by_losses(batch["attention_mask"], batch)).any()  # a tail left out
            else:
                assert widths[-1] == int(dependent.sum()) > example[0].num_blocks
    finally:
        hook.remove()
