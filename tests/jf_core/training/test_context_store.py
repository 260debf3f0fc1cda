"""A draft adapter's contexts kept between visits (jf_core/training/context_store.py) against computing them again."""

from __future__ import annotations

import pytest
import torch

from jf_core.training.config import JFTrainConfig
from jf_core.training.jf_data import jf_batches
from jf_core.training.losses import JacobiForcingObjective, JFLossConfig
from jf_core.training.noise import NoiseSchedule
from tests.conftest import PAD, TINY_MODELS
from tests.jf_core.training.test_mask_packing_losses import adapter_model
from tests.jf_core.training.test_spans import _examples


def _visits(batch_size: int, steps: int):
    examples = _examples(7, copies=2) + _examples(8, copies=2)  # four examples, two visits each at batch 2
    stream = jf_batches(examples, batch_size, PAD, seed=0, variant="clean_context",
                        redraw=NoiseSchedule("random", seed=3), copies=2, span=2, packing="spans")  # fmt: skip
    return [next(stream) for _ in range(steps)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_kept_context_gives_the_losses_and_gradients_of_one_computed_again(arch, batch_size):
    """Every visit's loss and adapter gradient, with the store, are those of the two passes without it; the later
    visits of an example read its context back (hits), and a store too small for one context keeps none."""
    model, _ = adapter_model(arch)
    batches = _visits(batch_size, 8 // batch_size)
    cfg = JFLossConfig(chunk=4)
    plain = JacobiForcingObjective(cfg, "clean_context")
    kept = JacobiForcingObjective(cfg, "clean_context", context_memory_mb=64)
    for batch in batches:
        results = []
        for objective in (plain, kept):
            model.zero_grad(set_to_none=True)
            loss, metrics = objective(model, batch)
            loss.backward()
            results.append((metrics, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
        (want, want_grads), (got, grads) = results
        assert got["consistency_loss"] == pytest.approx(want["consistency_loss"], rel=1e-5)
        assert grads.keys() == want_grads.keys()
        for k in grads:
            torch.testing.assert_close(grads[k], want_grads[k], rtol=1e-4, atol=1e-6)
    assert plain.store is None
    assert (kept.store.misses, kept.store.hits) == (4, 4) and len(kept.store.entries) == 4
    # A step's metrics say so (the training history's rows): hits, misses and their seconds, the MB kept.
    figures = kept.summarize({})
    assert (figures["context_hits"], figures["context_misses"]) == (4.0, 4.0) and figures["context_miss_s"] > 0
    assert figures["context_kept_mb"] == kept.store.bytes / 2**20 > 0
    assert not any(k.startswith("context_") for k in plain.summarize({}))
    tiny = JacobiForcingObjective(cfg, "clean_context", context_memory_mb=1)
    tiny.store.limit_bytes = 1  # smaller than any context
    tiny(model, batches[0])
    assert not tiny.store.entries and tiny.store.bytes == 0


def test_a_full_store_keeps_what_it_has_and_computes_the_rest_on_each_visit():
    """Room for two of four examples over two shuffled epochs: the first two visited are kept and never dropped, so
    every later visit to them hits and every visit to the other two computes its context (a store that dropped the
    least recently seen would keep the last two of the first epoch instead, and a new order reaches them late)."""
    model, _ = adapter_model("qwen2")
    objective = JacobiForcingObjective(JFLossConfig(), "clean_context", context_memory_mb=1)
    batches = _visits(1, 8)
    objective(model, batches[0])
    one = objective.store.bytes
    objective.store.limit_bytes = 2 * one + one // 2  # room for two of these contexts (they differ a little)
    visited = [int(batch["example"][0]) for batch in batches]
    kept = list(dict.fromkeys(visited))[:2]
    assert sorted(set(visited[:4])) == sorted(set(visited[4:])) == [0, 1, 2, 3]  # two epochs of the four
    for batch in batches[1:]:
        objective(model, batch)
        assert list(objective.store.entries) == kept and objective.store.bytes <= objective.store.limit_bytes
    assert objective.store.hits == sum(i in kept for i in visited[4:]) == 2
    assert objective.store.misses == 6


def test_a_kept_context_is_one_block_of_memory_of_its_own():
    """Its 2 x layers + 1 tensors are views of one mapping (not 61 blocks left in malloc's heap for hundreds of steps
    between the step's own tensors: a fragmented heap slowed the whole step), each aligned as a fresh tensor is."""
    model, _ = adapter_model("llama")
    objective = JacobiForcingObjective(JFLossConfig(), "clean_context", context_memory_mb=64)
    objective(model, _visits(1, 1)[0])
    (context,) = objective.store.entries.values()
    parts = (*context.keys, *context.values, context.hidden)
    assert len(parts) == 2 * model.config.num_hidden_layers + 1
    storages = {t.untyped_storage().data_ptr() for t in parts}
    assert len(storages) == 1
    assert parts[0].untyped_storage().nbytes() >= context.nbytes
    assert all(t.data_ptr() % 64 == 0 and t.is_contiguous() for t in parts)


def test_a_kept_context_needs_the_spans_layout_and_acts_on_an_adapter_only():
    from jf_core.draft_adapter.config import DraftLora

    adapter = {"draft_lora": DraftLora(rank=4), "mask": "clean_context"}
    with pytest.raises(ValueError, match=r"training.context_memory_mb .* training.packing spans"):
        JFTrainConfig(context_memory_mb=64, **adapter)
    whole = JFTrainConfig(context_memory_mb=64, packing="spans", mask="clean_context")  # no adapter: inert, as
    model = TINY_MODELS["qwen2"]()  # context_cache is: the whole model's context changes as it trains
    batch = _visits(1, 1)[0]
    objective = JacobiForcingObjective.of(whole)
    objective(model, batch)
    assert objective.store is not None and objective.store.hits + objective.store.misses == 0
    with pytest.raises(ValueError, match=r"training.context_memory_mb .* training.context_cache true"):
        JFTrainConfig(context_memory_mb=64, packing="spans", context_cache=False, **adapter)
    assert JFTrainConfig(context_memory_mb=64, packing="spans", **adapter).context_memory_mb == 64
