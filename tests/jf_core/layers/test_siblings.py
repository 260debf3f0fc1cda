"""Projections of one input as one packed product (jf_core/layers/siblings.py): q, k and v and gate and up grouped
on Qwen2 (biased q, k, v) and Llama; the grouped forward is the ungrouped one to fp32 rounding, with and without a
draft adapter acting (its A riding in the group's product, its Bs one block-diagonal addmm); a member fed another
input runs alone; and greedy decoding on a grouped model is still its AR, token for token."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from jf_core.draft_adapter.config import DraftLora
from jf_core.layers.lora import single_run
from jf_core.layers.packed import AVAILABLE, PackedLinear, pack_linears, unpacked
from jf_core.layers.siblings import Siblings, group_siblings, ungrouped

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="this torch build has no oneDNN")


def _grouped(tiny_model) -> nn.Module:
    model = copy.deepcopy(tiny_model)
    assert pack_linears(model, min_bytes=0) > 0
    layers = model.config.num_hidden_layers
    assert group_siblings(model) == 2 * layers  # q, k, v and gate, up in every layer
    return model


def _products(model: nn.Module, ids: torch.Tensor) -> int:
    """How many oneDNN linear products one forward runs."""
    with torch.no_grad(), torch.profiler.profile() as prof:
        model(input_ids=ids)
    return sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")


def test_the_grouped_forward_is_the_ungrouped_one_with_and_without_an_adapter(tiny_model):
    from jf_core.draft_adapter.adapter import attach_draft_adapter, draft_gate, gated

    model = _grouped(tiny_model)
    ids = torch.tensor([[5, 9, 13, 7, 21, 4], [8, 8, 3, 30, 2, 11]])
    with torch.no_grad():
        grouped = model(input_ids=ids).logits
        with ungrouped():
            alone = model(input_ids=ids).logits
    torch.testing.assert_close(grouped, alone, rtol=1e-5, atol=1e-5)
    with ungrouped():
        separate = _products(model, ids)
    assert _products(model, ids) == separate - 3 * model.config.num_hidden_layers  # 7 products a layer -> 4
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    for b in adapter.b.values():
        nn.init.normal_(b, std=0.5)
    gate = draft_gate([range(1, 6), range(3, 5)], ids.shape[1])
    with torch.no_grad(), gated(model, gate):
        drafted = model(input_ids=ids).logits
        with ungrouped():
            drafted_alone = model(input_ids=ids).logits
    torch.testing.assert_close(drafted, drafted_alone, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(drafted[0, 1:], grouped[0, 1:])  # the adapter acted through the groups
    torch.testing.assert_close(drafted[1, :3], grouped[1, :3], rtol=1e-5, atol=1e-5)  # ungated slots: the base's
    kept = [m.siblings._held for m in model.modules() if isinstance(m, PackedLinear) and m.siblings is not None]
    assert not any(kept)  # every member served: no input is held past its forward
    # One run of gated rows (a batch-1 window's chain, as decoding lays it out) takes the in-place form
    # (lora.single_run): the same logits as the hooks' delta on F.linear's products.
    run_gate = draft_gate([range(0), range(3, 6)], ids.shape[1])
    assert single_run(adapter.scale * run_gate[..., None]) == (9, 12, adapter.scale)
    with torch.no_grad(), gated(model, run_gate):
        in_place = model(input_ids=ids).logits
        with unpacked():
            hooked = model(input_ids=ids).logits
    torch.testing.assert_close(in_place, hooked, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(in_place[0], grouped[0], rtol=1e-5, atol=1e-5)  # the row off the run: the base's


def test_a_member_fed_another_input_runs_alone_and_an_uneven_adapter_leaves_the_group():
    """A model that feeds its projections different tensors, and an adapter on q and v but not k, still get each
    member's own product: the same values as ungrouped."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter, draft_gate, gated

    torch.manual_seed(0)
    parent = nn.Module()
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(parent, name, nn.Linear(24, 16, bias=False))
    assert pack_linears(parent, min_bytes=0) == 3 and group_siblings(parent) == 1
    assert isinstance(parent.q_proj.siblings, Siblings)
    x, other = torch.randn(1, 3, 24), torch.randn(1, 3, 24)
    with torch.no_grad():
        got = [parent.q_proj(x), parent.k_proj(other), parent.v_proj(x)]
        members = (parent.q_proj, parent.k_proj, parent.v_proj)
        want = [nn.functional.linear(t, m.weight) for t, m in zip((x, other, x), members, strict=True)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    adapter = attach_draft_adapter(parent, DraftLora(rank=2, targets=("q_proj", "v_proj")))
    for b in adapter.b.values():
        nn.init.normal_(b, std=0.5)
    with torch.no_grad(), gated(parent, draft_gate([range(1, 3)], 3)):
        uneven = [m(x) for m in (parent.q_proj, parent.k_proj, parent.v_proj)]
        with ungrouped():
            alone = [m(x) for m in (parent.q_proj, parent.k_proj, parent.v_proj)]
    for g, w in zip(uneven, alone, strict=True):
        torch.testing.assert_close(g, w)


def test_greedy_decoding_on_a_grouped_model_is_its_ar_with_a_draft_adapter_acting(tiny_model):
    from jf_core.decoding.common import StopTokens
    from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
    from jf_core.draft_adapter.adapter import attach_draft_adapter
    from tests.conftest import PAD
    from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference

    model = _grouped(tiny_model)
    ps = prompts(3, seed=11)
    want = [reference(model, p, MAX_NEW, None) for p in ps]
    with torch.no_grad(), ungrouped():
        assert [reference(model, p, MAX_NEW, None) for p in ps] == want  # grouping changes no greedy token here
    cfg = JFDecodeConfig(block_size=16, num_blocks=1, pool_size=0, lookup=16, adaptive_width=True, width_scale=1.0,
                         width_margin=2, max_new_tokens=MAX_NEW)  # fmt: skip
    assert JFDecoder(model, cfg, stop=StopTokens(None, PAD)).decode(ps).sequences == want
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    for b in adapter.b.values():
        nn.init.normal_(b, std=0.5)
    cfg = JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, draft_span=3, max_new_tokens=MAX_NEW)
    assert JFDecoder(model, cfg, stop=StopTokens(None, PAD)).decode(ps).sequences == want


def _matmuls(fn) -> int:
    """How many matrix products (forward and backward) `fn` runs."""
    with torch.profiler.profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))


@pytest.mark.parametrize("targets", [None, ("gate_proj", "up_proj", "down_proj")])
def test_a_draft_adapters_training_step_grouped_is_the_ungrouped_one_in_fewer_products(tiny_model, targets):
    """Under training's bf16 autocast the frozen members run one cast product a group and the adapter's deltas one
    A product and one block-diagonal B product a group, with autograd: the loss and every adapter gradient are the
    ungrouped step's (to bf16 rounding), and the step runs fewer products."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter, draft_gate, gated

    model = _grouped(tiny_model)
    config = DraftLora(rank=4) if targets is None else DraftLora(rank=4, targets=targets)
    adapter = attach_draft_adapter(model, config)
    torch.manual_seed(1)
    for b in adapter.b.values():
        nn.init.normal_(b, std=0.5)
    ids = torch.tensor([[5, 9, 13, 7, 21, 4], [8, 8, 3, 30, 2, 11]])
    gate = draft_gate([range(1, 6), range(3, 5)], ids.shape[1])

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with gated(model, gate), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids).logits.float().pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in adapter.parameters()]

    loss, grads = step()
    with ungrouped():
        loss_alone, grads_alone = step()
        alone = _matmuls(step)
    torch.testing.assert_close(loss, loss_alone, rtol=2e-2, atol=1e-3)
    for g, w in zip(grads, grads_alone, strict=True):
        assert torch.nn.functional.cosine_similarity(g.flatten(), w.flatten(), dim=0) > 0.99
    assert _matmuls(step) < alone
    assert all(g.abs().sum() > 0 for g in grads)  # every A and B got a gradient through the groups
