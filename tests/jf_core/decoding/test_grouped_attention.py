"""Grouped-KV SDPA (jf_core/decoding/grouped_attention.py): torch's kernel reading grouped KV heads in place gives
bitwise transformers' SDPA over copied heads, only where it applies, and a Jacobi decode runs on it and gives the
model back as it was."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from jf_core.decoding import grouped_attention as grouped
from jf_core.decoding.backends import attention_implementation
from jf_core.decoding.backends import grouped_attention as grouped_attention_on
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from tests.conftest import PAD, VOCAB, _llama, _qwen2
from tests.jf_core.decoding.test_jacobi import prompts, reference


def attention_inputs(query_len: int, dtype: torch.dtype):
    """A Qwen2 attention module (4 query heads on 2 KV heads) and a masked query over a cache with holes."""
    module = _qwen2().model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    batch, keys, dim = 2, 19, module.head_dim
    query = torch.randn(batch, 4, query_len, dim, generator=g).to(dtype)
    key, value = (torch.randn(batch, 2, keys, dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(batch, 1, query_len, keys, dtype=torch.bool)
    mask[..., -query_len:] = torch.tril(torch.ones(query_len, query_len, dtype=torch.bool))
    mask[0, ..., 3:7] = False  # dead slots in one row
    return module, query, key, value, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_masked_window_over_grouped_heads_is_bitwise_transformers_sdpa(dtype, monkeypatch):
    module, query, key, value, mask = attention_inputs(5, dtype)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=module.scaling)

    def copied_heads(*args, **kwargs):
        raise AssertionError("a masked window over grouped heads went to transformers' SDPA (repeat_kv)")

    monkeypatch.setattr(grouped, "sdpa_attention_forward", copied_heads)
    got, _ = grouped.grouped_sdpa_forward(module, query, key, value, mask, scaling=module.scaling)
    assert got.shape == expected.shape and got.dtype == dtype
    assert torch.equal(got, expected)


def test_one_query_token_goes_to_transformers_sdpa(monkeypatch):
    """AR's single token keeps transformers' own path (it folds the query heads onto the KV heads, faster than
    torch's grouped kernel at one token): the AR baseline does not change."""
    module, query, key, value, mask = attention_inputs(1, torch.float32)
    calls = []
    monkeypatch.setattr(grouped, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or (None, None))
    grouped.grouped_sdpa_forward(module, query, key, value, mask, scaling=module.scaling)
    assert calls == [1]


@pytest.mark.parametrize(("build", "groups"), [(_qwen2, True), (_llama, False)])
def test_a_jacobi_decode_runs_on_grouped_sdpa_where_heads_are_grouped_and_gives_the_model_back(build, groups):
    model = build()
    seen: set[str | None] = set()
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.add(attention_implementation(module.config))
    )
    ps = prompts(3)
    expected = [reference(model, p, 24, None) for p in ps]
    seen.clear()
    out = jacobi_decode(model, ps, JacobiConfig(block_size=7, max_new_tokens=24), stop=StopTokens(None, PAD))
    hook.remove()
    assert out.sequences == expected
    assert seen == ({grouped.GROUPED_SDPA} if groups else {"sdpa"})
    assert attention_implementation(model) == "sdpa"


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_training_through_grouped_heads_gives_transformers_sdpa_loss_and_gradients(compute):
    """Training on a CPU runs on it too (jf_core/round/training.py): in fp32 on torch's kernel, the same loss bit for
    bit and the same gradients to rounding (the KV heads' gradients are summed over their query heads in another
    order); in bf16 autocast on the eager form (`eager_grouped`), the loss and gradients to bf16's rounding, and on
    the kernel again where the bench switches the eager form off (`kernel_backward`), the loss bit for bit."""
    model = _qwen2().train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    mask = torch.tril(torch.ones(12, 12, dtype=torch.bool)) & (torch.rand(2, 1, 12, 12, generator=g) > 0.3)
    mask |= torch.eye(12, dtype=torch.bool)  # every query sees itself, as a packed noise-aware mask lets it
    seen: set[str | None] = set()
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.add(attention_implementation(module.config))
    )

    def loss_and_gradients():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=compute == torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(12).expand(2, 12)).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.roll(-1, 1).flatten())
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    copied, copied_grads = loss_and_gradients()
    with grouped_attention_on(model):
        loss, grads = loss_and_gradients()
        with grouped.kernel_backward():
            kernel_loss, _ = loss_and_gradients()
    assert seen == {"sdpa", grouped.GROUPED_SDPA}
    assert torch.equal(kernel_loss, copied)
    if compute == torch.float32:
        assert torch.equal(loss, copied)
        tolerance = {"rtol": 1e-5, "atol": 1e-6}
    else:
        torch.testing.assert_close(loss, copied, rtol=1e-2, atol=0)
        tolerance = {"rtol": 5e-2, "atol": 2e-3}
    for got, want in zip(grads, copied_grads, strict=True):
        torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_eager_form_is_sdpa_s_attention_and_gradients_to_rounding(dtype):
    """`eager_grouped` (scores in the compute dtype, softmax in fp32, query heads folded onto their KV head) against
    transformers' SDPA over copied heads: outputs and the gradients of query, key and value to the dtype's rounding,
    with dead slots in the cache; a query that sees no key gets uniform weights, not NaN."""
    module, query, key, value, mask = attention_inputs(5, dtype)
    results = []
    for form in ("sdpa", "eager"):
        leaves = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
        if form == "sdpa":
            out, _ = sdpa_attention_forward(module, *leaves, mask, scaling=module.scaling)
        else:
            out = grouped.eager_grouped(*leaves, mask, module.scaling)
        out.float().square().sum().backward()
        results.append([out.detach(), *(t.grad for t in leaves)])
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}
    for got, want in zip(results[1], results[0], strict=True):
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, **tolerance)
    blind = mask.clone()
    blind[1, :, 2] = False  # the second row's third query sees nothing
    out = grouped.eager_grouped(query, key, value, blind, module.scaling)
    assert not out.isnan().any()
    torch.testing.assert_close(out[1, 2].float(), value[1].float().mean(1).repeat_interleave(2, 0), **tolerance)


def test_only_a_bf16_training_attention_takes_the_eager_form(monkeypatch):
    """The eager form where a gradient is wanted in bf16 (autocast's or the tensors' own) of an attention of at most
    `EAGER_MAX_SCORES` scores a sequence; torch's kernel for a no-gradient call (training's context pass, decoding),
    for fp32 training and for a larger attention."""
    module, query, key, value, mask = attention_inputs(5, torch.float32)
    calls = []
    monkeypatch.setattr(grouped, "eager_grouped", lambda *a: calls.append("eager") or query.transpose(1, 2))
    kernel = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append("kernel") or kernel(*a, **k))  # fmt: skip

    def run(grad: bool, bf16: bool) -> str:
        calls.clear()
        q = query.detach().clone().requires_grad_(grad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            grouped.grouped_sdpa_forward(module, q, key, value, mask, scaling=module.scaling)
        return calls[0]

    assert run(grad=True, bf16=True) == "eager"
    assert run(grad=False, bf16=True) == "kernel"
    assert run(grad=True, bf16=False) == "kernel"
    with torch.no_grad():
        assert run(grad=True, bf16=True) == "kernel"
    scores = query.shape[1] * query.shape[2] * key.shape[2]  # heads x queries x keys of a sequence
    monkeypatch.setattr(grouped, "EAGER_MAX_SCORES", scores)
    assert run(grad=True, bf16=True) == "eager"
    monkeypatch.setattr(grouped, "EAGER_MAX_SCORES", scores - 1)  # a larger attention: the kernel's
    assert run(grad=True, bf16=True) == "kernel"
