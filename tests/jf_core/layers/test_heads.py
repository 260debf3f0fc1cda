"""The LM head as decoding computes it (jf_core/layers/heads.py): by vocabulary slices, packed, or in fp32."""

from __future__ import annotations

from jf_core.models import load_model
from tests.jf_core.test_models import save_tiny


def test_a_window_s_logits_on_a_cpu_come_by_slices_of_the_vocabulary_and_are_the_heads_own(tmp_path):
    """Where a gradient is needed, `load_model`'s LM head computes a window's logits against 2,048-row slices of the
    head on a CPU (MKL's one matmul is up to 3x slower there for a few rows against a large vocabulary): each logit
    is the same dot product, so the logits are the whole head's bit for bit at every row count, in batches, with the
    weight still tied to the embedding, and a backward through the slices gives the whole head's gradients (to
    rounding). Without a gradient the head is packed (layers/packed.py): the same logits to fp32 rounding."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jf_core.layers.heads import VOCAB_SLICE, SlicedLMHead
    from jf_core.layers.packed import PackedWeight

    tok = save_tiny(tmp_path)
    config = Qwen2Config(vocab_size=5000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path))
    head = model.get_output_embeddings()
    assert isinstance(head, SlicedLMHead) and config.vocab_size > 2 * VOCAB_SLICE
    assert head.weight is model.get_input_embeddings().weight  # still tied
    hidden_states = []
    model.model.register_forward_hook(lambda _m, _a, out: hidden_states.append(out.last_hidden_state))
    for batch, rows in [(1, 1), (1, 2), (1, 11), (1, 31), (2, 16), (1, 64), (1, 65), (3, 40)]:
        ids = torch.randint(2, len(tok), (batch, rows))
        logits = model(input_ids=ids).logits.detach()
        whole = torch.nn.functional.linear(hidden_states[-1], head.weight).detach()
        assert torch.equal(logits, whole), (batch, rows)
        for packs in (None, PackedWeight()):  # this model is small enough to stay on MKL; packed as a larger one is
            head.packed_weight = packs
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            torch.testing.assert_close(logits, torch.nn.functional.linear(hidden_states[-1], head.weight))
        assert head.packed_weight._packed is not None
        head.packed_weight = None

    linear = torch.nn.Linear(64, 5000)  # a head with a bias, trained through the slices: the whole head's gradients
    sliced = SlicedLMHead(linear)  # the same parameters
    hidden = torch.randn(11, 64, requires_grad=True)
    grads = []
    for form in (linear, sliced):
        form(hidden).square().sum().backward()
        grads.append([t.grad.clone() for t in (hidden, linear.weight, linear.bias)])
        for t in (hidden, linear.weight, linear.bias):
            t.grad = None
    # The hidden state's gradient sums over the vocabulary slice by slice, in another order than one matmul: its
    # elements (up to ~200 here) differ by a few fp32 ulps of the largest, which near-zero elements cannot meet in
    # relative terms (an Intel Xeon's MKL left 6e-6 where the EPYC's met 1e-6); a lost slice would be ~1-100.
    for got, want in zip(*grads, strict=True):
        ulps = 8 * torch.finfo(torch.float32).eps * float(want.abs().max())
        torch.testing.assert_close(got, want, rtol=2e-5, atol=ulps)


def test_fp32_lm_head_gives_fp32_logits_of_the_same_weights(tmp_path):
    import torch

    save_tiny(tmp_path)
    bf16, _ = load_model(str(tmp_path), dtype="bfloat16")
    upcast, _ = load_model(str(tmp_path), dtype="bfloat16", lm_head_fp32=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        low, high = bf16(input_ids=ids).logits, upcast(input_ids=ids).logits
    assert low.dtype == torch.bfloat16 and high.dtype == torch.float32
    assert next(upcast.model.parameters()).dtype == torch.bfloat16  # only the head is fp32
    torch.testing.assert_close(high.to(torch.bfloat16), low, rtol=0.02, atol=0.02)


def test_under_autocast_a_frozen_head_is_cast_once_and_gives_autocast_s_logits_and_gradient():
    """A draft adapter's training reads the frozen head several times a step under CPU autocast, which casts a weight
    that needs no gradient on every call: the head keeps one bf16 copy instead. Its logits and the hidden state's
    gradient are autocast's whole-head product's bit for bit, at a few rows and at many; the copy is made once and
    remade when the weight is written in place; a head that trains is left to autocast."""
    import torch

    from jf_core.layers.heads import SlicedLMHead, uncast_head

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 5000, bias=False).requires_grad_(False)
    head = SlicedLMHead(linear)
    for rows in (11, 200):
        results = []
        for kept in (True, False):
            hidden = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = head(hidden) if kept else torch.nn.functional.linear(hidden, linear.weight)
            logits.float().square().sum().backward()
            results.append((logits.detach(), hidden.grad))
        (got, got_grad), (want, want_grad) = results
        assert got.dtype == torch.bfloat16 and torch.equal(got, want) and torch.equal(got_grad, want_grad), rows
    kept = head.cast_weight._cast
    assert kept is not None and kept.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        head(torch.randn(3, 64))
    assert head.cast_weight._cast is kept  # not cast again
    with torch.no_grad():
        linear.weight.mul_(2.0)  # a loaded state dict
    with torch.autocast("cpu", dtype=torch.bfloat16):
        head(torch.randn(3, 64))
    assert head.cast_weight._cast is not kept
    before = SlicedLMHead(linear)
    with uncast_head(), torch.autocast("cpu", dtype=torch.bfloat16):  # the bench's "before": autocast casts
        before(torch.randn(3, 64))
    assert before.cast_weight._cast is None
    trained = SlicedLMHead(torch.nn.Linear(64, 5000))  # requires grad: autocast's cast and the weight's gradient
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trained(torch.randn(3, 64)).float().sum().backward()
    assert trained.cast_weight._cast is None and trained.weight.grad is not None
