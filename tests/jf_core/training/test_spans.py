"""The spans layout (jf_core/training/spans.py) against the paper's blocks layout it stands for."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from jf_core.training.config import JFTrainConfig
from jf_core.training.losses import JacobiForcingObjective, JFLossConfig
from jf_core.training.mask import CLEAN, PROMPT, SPAN, build_mask, mask_mod
from jf_core.training.packing import PackedExample, blocks_row, collate, loss_positions
from jf_core.training.spans import spans_row
from tests.conftest import PAD, TINY_MODELS
from tests.jf_core.training.test_mask_packing_losses import adapter_model, gated_forward

N = 5


def _noisy(rng: random.Random, clean: list[int]) -> list[int]:
    """A draft state of `clean`: right up to a random first departure (anywhere, the first token included, or
    nowhere: the fixed point itself), random after it."""
    first = rng.randrange(N + 1)
    tail = [rng.randrange(3, 500) for _ in range(N - first)]
    if tail and tail[0] == clean[first]:
        tail[0] = clean[first] + 1
    return clean[:first] + tail


def _examples(seed: int, copies: int = 1) -> list[PackedExample]:
    """Two examples of different prompts and answer lengths, the second's last block ending at EOS (length 3),
    each block with `copies` noisy copies departing where they happen to (and those states to draw from again)."""
    rng = random.Random(seed)
    out = []
    for prompt_len, blocks, last in ((3, 3, N), (6, 2, 3)):
        clean = [[rng.randrange(3, 500) for _ in range(N)] for _ in range(blocks)]
        draws = [[_noisy(rng, c) for c in clean] for _ in range(copies)]
        prompt = [rng.randrange(3, 500) for _ in range(prompt_len)]
        lengths = [N] * (blocks - 1) + [last]
        states = [[*(d[j] for d in draws), clean[j]] for j in range(blocks)]  # the fixed point last
        out.append(PackedExample("e", prompt, N, draws[0], clean, lengths, states, extra_noisy=draws[1:]))
    return out


def _step(model, batch, cfg, context_cache=True):
    model.zero_grad(set_to_none=True)
    loss, metrics = JacobiForcingObjective(cfg, "clean_context", context_cache=context_cache)(model, batch)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), metrics, grads


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("consistency", ["kl", "fixed_point"])
@pytest.mark.parametrize("span", [0, 1, 3])
@pytest.mark.parametrize("copies", [1, 2])
def test_spans_train_the_adapter_as_the_blocks_layout_does(arch, consistency, span, copies):
    """The same consistency loss and the same adapter gradients as the blocks layout, in the adapter's two passes
    and in one packed forward, from fewer packed tokens."""
    model, _ = adapter_model(arch)
    examples = _examples(0, copies)
    cfg = JFLossConfig(consistency=consistency, chunk=4)
    blocks = collate(examples, PAD, "clean_context", span=span)
    spans = collate(examples, PAD, "clean_context", span=span, row=spans_row)
    assert int(spans["packed_tokens"]) < int(blocks["packed_tokens"])
    assert int(spans["cons_valid"].sum()) == int(blocks["cons_valid"].sum()) > 0
    _, want, want_grads = _step(model, blocks, cfg)
    for context_cache in (True, False):
        _, got, grads = _step(model, spans, cfg, context_cache)
        assert got["consistency_loss"] == pytest.approx(want["consistency_loss"], rel=1e-5, abs=1e-7)
        assert grads.keys() == want_grads.keys() and any(g.abs().sum() > 0 for g in grads.values())
        for k in grads:
            torch.testing.assert_close(grads[k], want_grads[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_spans_train_a_whole_model_as_the_blocks_layout_does(arch):
    """A whole model's noisy prefix and clean prefix share its weights too: the AR and consistency losses and every
    weight's gradient are the blocks layout's."""
    model = TINY_MODELS[arch]()
    examples = _examples(1, copies=2)
    cfg = JFLossConfig(chunk=4)
    _, want, want_grads = _step(model, collate(examples, PAD, "clean_context", span=2), cfg)
    _, got, grads = _step(model, collate(examples, PAD, "clean_context", span=2, row=spans_row), cfg)
    assert got["ar_loss"] == pytest.approx(want["ar_loss"], rel=1e-5)
    assert got["consistency_loss"] == pytest.approx(want["consistency_loss"], rel=1e-5)
    assert grads.keys() == want_grads.keys() and len(grads) == len(list(model.parameters()))
    for k in grads:
        torch.testing.assert_close(grads[k], want_grads[k], rtol=1e-4, atol=1e-5)


def test_a_span_sees_the_clean_text_before_its_departure():
    """Each student's logits are the blocks layout's; a span's row of the mask is the prompt, the clean tokens at
    positions before its departure and its own tokens up to itself; the context is one causal text; spans past
    their last student, and blocks at their fixed point, are not packed."""
    model, _ = adapter_model("llama")
    ex = _examples(2, copies=2)[0]
    row = spans_row(ex, 2)
    blocks = collate([ex], PAD, "clean_context", span=2)
    spans = collate([ex], PAD, "clean_context", span=2, row=spans_row)
    with (
        torch.no_grad(),
        gated_forward(model, blocks, "clean_context") as want,
        gated_forward(model, spans, "clean_context") as got,
    ):
        for (s_b, t_b, h_b), (s_s, t_s, h_s) in zip(loss_positions(ex, 2)[1], row.cons, strict=True):
            assert h_b == h_s and blocks["position_ids"][0, s_b] == spans["position_ids"][0, s_s]
            torch.testing.assert_close(got[0, s_s], want[0, s_b], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got[0, t_s], want[0, t_b], rtol=1e-4, atol=1e-5)
    mask = spans["attention_mask"][0, 0]
    context = len(ex.prompt) + ex.num_blocks * N
    assert torch.equal(mask[:context, :context], torch.ones(context, context).tril().bool())
    assert row.kind[:context].tolist() == [PROMPT] * len(ex.prompt) + [CLEAN] * (context - len(ex.prompt))
    pos = spans["position_ids"][0]
    for q in range(context, len(row)):
        assert row.kind[q] == SPAN
        own = [k for k in range(context, q + 1) if row.block[k] == row.block[q] and row.copy[k] == row.copy[q]]
        seen = [k for k in range(context) if pos[k] < row.anchor[q]] + own
        assert mask[q].nonzero().flatten().tolist() == seen
    assert len(row) - context <= 2 * ex.copies * ex.num_blocks  # two slots a span at most


def test_a_fixed_point_or_post_eos_departure_packs_no_span():
    clean = [[5, 6, 7, 8, 9], [10, 11, 2, 0, 0]]  # block 1 ends at EOS (2): length 3
    ex = PackedExample("e", [1, 3], N, [list(clean[0]), [10, 11, 2, 40, 41]], clean, [5, 3])
    row = spans_row(ex, 0)
    assert len(row) == 2 + 2 * N and not row.cons and not row.drafted
    departed = replace(ex, noisy=[[5, 6, 30, 31, 32], [10, 40, 41, 42, 43]])
    row = spans_row(departed, 0)
    # block 0 from offset 2 to its end (its last slot predicts block 1's first token); block 1 at offset 1 only
    # (offset 2 is EOS: the token after it is not scored)
    assert row.ids[2 + 2 * N :] == [30, 31, 32, 40] and [s for s, _, _ in row.cons] == [12, 13, 14, 15]
    assert row.drafted == [12, 13, 14, 15] and row.anchor[12:].tolist() == [4, 4, 4, 8]


def test_flex_mask_mod_states_the_spans_rule():
    batch = collate(_examples(3, copies=2), PAD, "clean_context", span=3, row=spans_row)
    kind, block, copy, anchor = (batch[f"layout_{k}"] for k in ("kind", "block", "copy", "anchor"))
    mod = mask_mod(kind, block, "clean_context", copy, anchor)
    width = kind.shape[1]
    q = torch.arange(width)[:, None].expand(width, width)
    k = torch.arange(width)[None, :].expand(width, width)
    for b in range(2):
        assert torch.equal(mod(torch.full_like(q, b), 0, q, k), batch["attention_mask"][b, 0])
    assert (kind == SPAN).any()
    assert not torch.equal(build_mask(kind, block, "clean_context", copy), batch["attention_mask"])


def test_spans_need_the_clean_context_mask():
    with pytest.raises(ValueError, match=r"training.packing spans .* set training.mask clean_context"):
        JFTrainConfig(packing="spans")
    assert JFTrainConfig(packing="spans", mask="clean_context").packing == "spans"
    assert blocks_row(_examples(0)[0]).anchor.shape[0] == _examples(0)[0].total_length


def test_packing_fits_as_many_blocks_as_their_spans_leave_room_for():
    """A noisy copy in spans packs at most `draft_span` positions a block: packing's fit counts that, not a whole
    block a copy, so three copies of a 1-slot span fit where three whole copies would not."""
    from jf_core.training.noise import NoiseSchedule
    from jf_core.training.packing import pack_records
    from tests.jf_core.training.test_mask_packing_losses import record

    recs = [record("p", j, [[1, 9, 9, 9], [1, 2, 3, 4]], [1, 2, 3, 4]) for j in range(2)]
    prompt = len(recs[0]["prompt_ids"])
    room = prompt + 2 * (4 + 3 * 1)  # two blocks, each with three 1-slot spans
    (fit,), _ = pack_records(recs, NoiseSchedule("random"), room, copies=3, noisy_width=1)
    assert fit.num_blocks == 2
    whole, stats = pack_records(recs, NoiseSchedule("random"), room, copies=3)
    assert not whole and stats.dropped_blocks == {"max_length": 2}
