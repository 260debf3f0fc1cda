"""Packed linear layers (jf_core/layers/packed.py): oneDNN with the weight packed once, only where nothing needs a
gradient, in fp32 on a CPU; F.linear's values to rounding; remade when the weight changes; invisible to the state
dict, tying, pickling and the draft adapter; and greedy decoding on a packed model is still its AR, token for token."""

from __future__ import annotations

import contextlib
import copy
import pickle

import pytest
import torch
from torch import nn

from jf_core.layers.packed import AVAILABLE, PackedLinear, pack_linears, uncached_casts, unpacked

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="this torch build has no oneDNN")


def _linear(bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(48, 80, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_without_a_gradient_it_is_f_linear_to_rounding_at_every_row_count(bias):
    linear = _linear(bias)
    packed = PackedLinear.of(linear)
    for shape in [(1, 48), (2, 48), (1, 7, 48), (3, 31, 48), (65, 48)]:
        x = torch.randn(shape)
        with torch.no_grad():
            got = packed(x)
        assert packed.packed_weight._packed is not None  # it did run packed
        torch.testing.assert_close(got, nn.functional.linear(x, linear.weight, linear.bias).detach())
    x = torch.randn(5, 96)[:, ::2]  # a strided input, as a transposed attention output can be
    with torch.no_grad():
        torch.testing.assert_close(packed(x), nn.functional.linear(x, linear.weight, linear.bias))


def test_training_bf16_and_other_devices_keep_f_linear_bit_for_bit_and_its_gradients():
    linear = _linear()
    packed = PackedLinear.of(linear)
    x = torch.randn(4, 48, requires_grad=True)
    assert torch.equal(packed(x), linear(x))
    packed(x).square().sum().backward()
    assert linear.weight.grad is not None and x.grad is not None
    assert packed.packed_weight._packed is None  # a gradient was needed: never packed
    with torch.no_grad(), unpacked():  # what the bench measures packing against: F.linear, bit for bit
        assert torch.equal(packed(x), nn.functional.linear(x, linear.weight, linear.bias))
    assert packed.packed_weight._packed is None
    low = PackedLinear.of(_linear().to(torch.bfloat16))
    xb = torch.randn(4, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(low(xb), nn.functional.linear(xb, low.weight, low.bias))
    assert low.packed_weight._packed is None
    meta = PackedLinear.of(nn.Linear(48, 80, device="meta"))
    with torch.no_grad():
        assert meta(torch.empty(2, 48, device="meta")).shape == (2, 80)


def test_a_weight_of_a_tensor_subclass_keeps_f_linear():
    """A sharded weight (FSDP2's DTensor) is a parameter of a tensor subclass, which keeps its type: such a layer
    keeps F.linear, never a packed copy of one shard."""

    class Shard(torch.Tensor):  # stands for DTensor: what matters is a subclass's parameter
        pass

    packed = PackedLinear.of(_linear())
    packed.weight = nn.Parameter(packed.weight.detach().as_subclass(Shard))
    assert type(packed.weight) is Shard
    x = torch.randn(3, 48)
    with torch.no_grad():
        got = packed(x)
    assert packed.packed_weight._packed is None
    weight = packed.weight.as_subclass(torch.Tensor)
    torch.testing.assert_close(got.as_subclass(torch.Tensor), x @ weight.T + packed.bias)


def test_a_weight_written_in_place_is_packed_again():
    linear = _linear()
    packed = PackedLinear.of(linear)
    x = torch.randn(3, 48)
    with torch.no_grad():
        before = packed(x)
        linear.weight.mul_(2.0)  # what an optimizer step or load_state_dict does
        after = packed(x)
    torch.testing.assert_close(after, nn.functional.linear(x, linear.weight, linear.bias))
    assert not torch.allclose(before, after)
    with torch.inference_mode():  # a layer made under inference_mode (its weight keeps no version counter)
        made = PackedLinear.of(nn.Linear(48, 80))
        torch.testing.assert_close(made(x), nn.functional.linear(x, made.weight, made.bias))


@pytest.mark.parametrize("bias", [True, False])
def test_under_autocast_a_frozen_weight_is_cast_once_and_trains_bit_for_bit_as_autocast_does(bias):
    """A draft adapter's training: the base frozen, compute in bf16 by CPU autocast. The layer keeps one bf16 copy
    of the frozen weight (autocast caches no cast of a weight that requires no grad); outputs and the input's
    gradient equal autocast's own, bit for bit; the copy is remade when the weight is written in place; a product
    with no gradient under autocast (training's context pass) runs in autocast's dtype, not packed fp32; a weight
    that trains is left to autocast."""
    linear = _linear(bias).requires_grad_(False)
    packed = PackedLinear.of(linear)
    x = torch.randn(2, 9, 48)
    results = []
    for cached in (True, False):
        xi = x.clone().requires_grad_(True)
        with contextlib.nullcontext() if cached else uncached_casts():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = packed(xi)
            y.float().square().sum().backward()
        results.append((y, xi.grad))
    (y_kept, g_kept), (y_cast, g_cast) = results
    assert y_kept.dtype == torch.bfloat16 and torch.equal(y_kept, y_cast) and torch.equal(g_kept, g_cast)
    kept = packed.cast_weight._cast
    assert kept is not None and kept.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed(x)
    assert packed.cast_weight._cast is kept  # the same copy: not cast again
    with torch.no_grad():
        linear.weight.mul_(2.0)  # a loaded state dict
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = packed(x)
    assert packed.cast_weight._cast is not kept and torch.equal(again, torch.autocast("cpu", dtype=torch.bfloat16)(
        nn.functional.linear)(x, linear.weight, linear.bias))  # fmt: skip
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # a context pass: autocast's dtype, not packed
        context = packed(x)
    assert context.dtype == torch.bfloat16 and packed.packed_weight._packed is None
    with torch.no_grad():  # no autocast: packed fp32, as decoding runs
        assert packed(x).dtype == torch.float32 and packed.packed_weight._packed is not None
    trained = PackedLinear.of(_linear(bias))  # requires grad: autocast's cast (and its gradient) as ever
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trained(x.requires_grad_(True)).float().sum().backward()
    assert trained.cast_weight._cast is None and trained.weight.grad is not None


def test_packing_a_model_keeps_its_parameters_ties_state_dict_and_copies():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    keys = {k: v.data_ptr() for k, v in model.state_dict().items()}
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model, min_bytes=10**12) == 0  # a model this small stays cached: MKL is faster there
    assert pack_linears(model, min_bytes=0) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == keys  # the same tensors, the same names
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # packed copies are remade on use
            torch.testing.assert_close(clone(input_ids=ids).logits, want)


def test_greedy_decoding_on_a_packed_model_is_its_ar_with_a_draft_adapter_acting(tiny_model):
    """The contract on a packed model: Jacobi (with lookup and adaptive width) and AR through the packed kernels
    give `generate`'s text on the same packed model; a draft adapter attached after packing still acts (its hooks
    are on the same modules), and the output is still the base's."""
    from jf_core.decoding.common import StopTokens
    from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder
    from jf_core.draft_adapter.adapter import attach_draft_adapter, draft_adapter, draft_gate, gated
    from jf_core.draft_adapter.config import DraftLora
    from tests.conftest import PAD
    from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference

    model = copy.deepcopy(tiny_model)
    plain = copy.deepcopy(tiny_model)
    assert pack_linears(model, min_bytes=0) > 0
    ps = prompts(3, seed=7)
    want = [reference(model, p, MAX_NEW, None) for p in ps]
    for cfg in (
        JFDecodeConfig(block_size=8, num_blocks=2, pool_size=2, max_new_tokens=MAX_NEW),
        JFDecodeConfig(block_size=16, num_blocks=1, pool_size=0, lookup=16, adaptive_width=True, width_scale=1.0,
                       width_margin=2, max_new_tokens=MAX_NEW),
    ):  # fmt: skip
        assert JFDecoder(model, cfg, stop=StopTokens(None, PAD)).decode(ps).sequences == want
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    for b in adapter.b.values():
        nn.init.normal_(b, std=0.5)  # a random adapter: drafts differ from the base's guesses
    hooked = attach_draft_adapter(plain, DraftLora(rank=4))  # the same adapter on the unpacked model: forward hooks
    hooked.load_state_dict(adapter.state_dict())
    ids = torch.tensor([ps[0], ps[0][::-1]])
    gate = draft_gate([range(1, ids.shape[1]), range(2, 4)], ids.shape[1])
    with torch.no_grad():
        base = model(input_ids=ids).logits
        with gated(model, gate):
            drafted = model(input_ids=ids).logits
        with gated(plain, gate):
            want_drafted = plain(input_ids=ids).logits
        assert not any(getattr(m, "draft", None) for m in model.modules())  # the adapter left every layer
    assert draft_adapter(model) is adapter and not torch.allclose(base[0, 1:], drafted[0, 1:])
    # A and the weight in one packed product, then B: the hooked adapter's logits, to fp32 rounding.
    torch.testing.assert_close(drafted, want_drafted, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(base[1, :2], drafted[1, :2])  # ungated slots are the base's
    cfg = JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, draft_span=3, max_new_tokens=MAX_NEW)
    assert JFDecoder(model, cfg, stop=StopTokens(None, PAD)).decode(ps).sequences == want
