"""Mask, packing and loss equivalence: the one-pass machinery computes exactly what separate passes would."""

from __future__ import annotations

import contextlib
import itertools
import random

import pytest
import torch

from jf_core.draft_adapter.config import DraftLora
from jf_core.training.losses import JacobiForcingObjective, JFLossConfig, jf_losses
from jf_core.training.mask import build_mask, layout
from jf_core.training.noise import NoiseSchedule
from jf_core.training.packing import PackedExample, collate, draft_positions, loss_positions, pack_records
from tests.conftest import PAD, TINY_MODELS


def reference_mask(prompt_len, n, blocks, width, variant, copies=1):
    """The rules, written out position by position; noisy copy c > 0 of block j is kind "N<c>" after the clean
    blocks."""

    def where(i):
        if i < prompt_len:
            return ("P", -1, i)
        if i >= prompt_len + (1 + copies) * n * blocks:
            return ("pad", -1, i)
        seg = (i - prompt_len) // n
        if seg >= 2 * blocks:
            return (f"N{1 + (seg - 2 * blocks) // blocks}", (seg - 2 * blocks) % blocks, (i - prompt_len) % n)
        return ("N" if seg % 2 == 0 else "C", seg // 2, (i - prompt_len) % n)

    m = torch.zeros(width, width, dtype=torch.bool)
    for q in range(width):
        kq, bq, oq = where(q)
        for k in range(width):
            kk, bk, ok = where(k)
            if kq == "pad":
                ok_ = q == k
            elif kq == "P":
                ok_ = kk == "P" and k <= q
            elif kk == "P":
                ok_ = True
            elif kk == kq and bk == bq:
                ok_ = ok <= oq
            elif kq == "C":
                ok_ = kk == "C" and bk < bq
            else:  # a noisy copy: its own copy's earlier blocks (shipped) or the earlier clean blocks
                ok_ = kk == (kq if variant == "shipped" else "C") and bk < bq
            m[q, k] = ok_
    return m


@pytest.mark.parametrize("variant", ["shipped", "clean_context"])
def test_mask_equals_rules_on_random_layouts(variant):
    rng = random.Random(0)
    for _ in range(25):
        p, n, t, copies = rng.randint(1, 6), rng.randint(1, 5), rng.randint(1, 4), rng.choice([1, 1, 2, 3])
        width = p + (1 + copies) * n * t + rng.randint(0, 5)
        kind, block, copy = layout(p, n, t, width, copies)
        got = build_mask(kind[None], block[None], variant, copy[None])[0, 0]
        assert torch.equal(got, reference_mask(p, n, t, width, variant, copies))


def record(pid, j, states, fixed, length=None):
    return {
        "prompt_id": pid,
        "block_index": j,
        "n": len(fixed),
        "prompt_ids": [7, 8, 9],
        "states": states,
        "fixed_point": fixed,
        "length": length or len(fixed),
    }


def test_packing_layout_positions_and_policy():
    recs = [
        record("a", 0, [[1, 5, 5], [1, 2, 5], [1, 2, 3]], [1, 2, 3]),
        record("a", 1, [[4, 9, 9], [4, 5, 6]], [4, 5, 6]),
        record("a", 2, [[7, 9, 9], [7, 8, 9]], [7, 8, 9]),
        record("b", 0, [[1, 1, 1]], [1, 1, 1]),
        record("b", 2, [[2, 2, 2]], [2, 2, 2]),  # gap: block 1 missing
    ]
    packed, stats = pack_records(
        recs, NoiseSchedule("progressive", window=2, min_ratio=0.0, max_ratio=1.0), max_length=3 + 2 * 3 * 2
    )
    a, b = packed
    assert a.num_blocks == 2 and stats.dropped_blocks == {"max_length": 1, "gap": 1}
    # block 0 target ratio 0 -> the fixed point itself; block 1 target 1.0 -> the initial draft (ratio 2/3)
    assert a.noisy == [[1, 2, 3], [4, 9, 9]]
    assert a.input_ids() == [7, 8, 9, 1, 2, 3, 1, 2, 3, 4, 9, 9, 4, 5, 6]
    assert a.position_ids() == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 6, 7, 8]
    assert b.num_blocks == 1


def test_loss_positions_skip_converged_prefix_and_post_eos():
    ex = PackedExample(
        "x", [7, 8], 4, noisy=[[1, 9, 9, 9], [5, 6, 9, 9]], clean=[[1, 2, 3, 4], [5, 6, 2, 0]], lengths=[4, 3]
    )
    ar, cons = loss_positions(ex)
    # AR: C0 from the prompt's last token, C1[0] from C0's last token; C1 only through its valid length 3
    assert ar == [(1, 1), (6, 2), (7, 3), (8, 4), (9, 5), (14, 6), (15, 2)]
    # N0 differs from offset 1: t = 1..3 (t=3 predicts C1[0]); N1 differs from offset 2, and t=2 would predict a
    # post-EOS token, so nothing is kept for block 1
    assert cons == [(3, 7, 3), (4, 8, 4), (5, 9, 5)]


def separate_pass_losses(model, ex: PackedExample, cfg: JFLossConfig):
    """Reference: per block, plain causal forwards over [prompt][N_0..N_j] and [prompt][C_0..C_j]."""
    p, n = len(ex.prompt), ex.n
    at: dict[int, torch.Tensor] = {}
    for j in range(ex.num_blocks):
        noisy_seq = ex.prompt + [t for b in ex.noisy[: j + 1] for t in b]
        clean_seq = ex.prompt + [t for b in ex.clean[: j + 1] for t in b]
        ln = model(input_ids=torch.tensor([noisy_seq])).logits[0]
        lc = model(input_ids=torch.tensor([clean_seq])).logits[0]
        for t in range(n):
            at[ex.noisy_start(j) + t] = ln[p + j * n + t]
            at[ex.clean_start(j) + t] = lc[p + j * n + t]
        if j == 0:
            at[p - 1] = lc[p - 1]
    ar_pairs, cons = loss_positions(ex)
    ar = torch.stack([torch.nn.functional.cross_entropy(at[s][None], torch.tensor([t])) for s, t in ar_pairs]).mean()
    kls = []
    for s, t, _ in cons:
        log_p_t = torch.log_softmax(at[t] / cfg.temperature, -1)
        log_p_s = torch.log_softmax(at[s] / cfg.temperature, -1)
        kls.append((log_p_t.exp() * (log_p_t - log_p_s)).sum() * cfg.temperature**2)
    return ar, torch.stack(kls).mean()


def adapter_model(arch: str):
    """(a tiny model, its draft adapter) whose Bs are random: an adapter that changes the drafts (a fresh one's B is
    zero)."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter

    model = TINY_MODELS[arch]()
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    with torch.no_grad():
        for b in adapter.b.values():
            b.normal_(0, 0.5)
    return model, adapter


def _random_examples(seed: int, shapes: tuple[tuple[int, int], ...]) -> list[PackedExample]:
    """One example per (prompt length, blocks) of random tokens, blocks of 4 whose noisy copy keeps the first token
    (the position a Jacobi step always gets right) and draws the other three."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for prompt_len, blocks in shapes:
        clean = [torch.randint(3, 500, (4,), generator=g).tolist() for _ in range(blocks)]
        noisy = [[c[0], *torch.randint(3, 500, (3,), generator=g).tolist()] for c in clean]
        prompt = torch.randint(3, 500, (prompt_len,), generator=g).tolist()
        examples.append(PackedExample("e", prompt, 4, noisy, clean, [4] * blocks))
    return examples


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_one_pass_losses_equal_separate_passes(arch):
    model = TINY_MODELS[arch]()
    examples = _random_examples(seed=0, shapes=((3, 3), (6, 2)))
    cfg = JFLossConfig(temperature=2.0, chunk=3)  # several chunks per term
    batch = collate(examples, PAD)  # batch of 2 with padding
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
        ).logits
        _, metrics = jf_losses(logits, lambda rows: rows, batch, cfg)  # from the full logits
        _, lean = JacobiForcingObjective(cfg)(model, batch)  # the LM head on the loss positions only, in chunks
        refs = [separate_pass_losses(model, e, cfg) for e in examples]
    n_ar = [len(loss_positions(e)[0]) for e in examples]
    n_cons = [len(loss_positions(e)[1]) for e in examples]
    ar_ref = sum(r[0] * k for r, k in zip(refs, n_ar, strict=True)) / sum(n_ar)
    cons_ref = sum(r[1] * k for r, k in zip(refs, n_cons, strict=True)) / sum(n_cons)
    for m in (metrics, lean):
        assert m["ar_loss"] == pytest.approx(ar_ref.item(), abs=1e-5)
        assert m["consistency_loss"] == pytest.approx(cons_ref.item(), abs=1e-5)


def test_lean_loss_has_the_full_logits_gradients():
    """The chunked, checkpointed head gives the same loss and the same gradients as the model's own logits."""
    import copy

    base = TINY_MODELS["qwen2"]()
    g = torch.Generator().manual_seed(3)
    clean = [torch.randint(3, 500, (4,), generator=g).tolist() for _ in range(3)]
    noisy = [[c[0], *torch.randint(3, 500, (3,), generator=g).tolist()] for c in clean]
    batch = collate([PackedExample("e", [5, 6, 7], 4, noisy, clean, [4, 4, 4])], PAD)
    grads = {}
    for lean in (False, True):
        model = copy.deepcopy(base).train()
        loss, _ = JacobiForcingObjective(JFLossConfig(chunk=2), lean=lean)(model, batch)
        loss.backward()
        grads[lean] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[True][0] == pytest.approx(grads[False][0], abs=1e-6)
    assert grads[True][1].keys() == grads[False][1].keys()
    for name, grad in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("consistency", ["kl", "tv", "fixed_point"])
def test_a_frozen_heads_loss_chunks_take_their_gradient_as_they_are_computed(consistency):
    """Under a draft adapter no gradient reaches the LM head, so each loss chunk's gradient is taken as the chunk is
    computed (`_GradientNow`), from half the head's products (a checkpoint's backward ran the teacher's and the
    student's again): in fp32 the same loss and adapter gradients as checkpointing the chunks; under bf16 autocast
    as close to fp32's as checkpointing's are (the gradient arriving from the loss scales the chunk's after its
    rounding, not before)."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    from jf_core.draft_adapter.adapter import attach_draft_adapter
    from jf_core.training.head import checkpointed_heads

    base = TINY_MODELS["qwen2"]()
    attach_draft_adapter(base, DraftLora(rank=4))
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero: give the adapter a say, so its gradients depend on the head's
        for p in base.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    batch = collate(_random_examples(2, ((3, 2), (5, 3))), PAD, "clean_context")
    cfg = JFLossConfig(chunk=2, temperature=2.0, consistency=consistency)

    def run(now: bool, dtype: torch.dtype):
        model = copy.deepcopy(base).train()
        rows = []
        model.get_output_embeddings().register_forward_hook(
            lambda module, args, out: rows.append(args[0].shape[0]) if args[0].numel() else None
        )
        # Under FlopCounterMode too, whose module hooks track the inputs' gradients (a leaf refused them).
        with contextlib.nullcontext() if now else checkpointed_heads(), FlopCounterMode(display=False) as counted:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss, _ = JacobiForcingObjective(cfg, "clean_context")(model, batch)
            loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        return loss.item(), grads, rows, counted.get_total_flops()

    (loss_now, now, rows_now, flops_now) = run(True, torch.float32)
    (loss_then, then, rows_then, flops_then) = run(False, torch.float32)
    assert flops_now < flops_then
    assert loss_now == pytest.approx(loss_then, rel=1e-6)
    assert then.abs().sum() > 0
    torch.testing.assert_close(now, then, rtol=1e-5, atol=1e-7)
    heads = 1 if consistency == "fixed_point" else 2  # the student's head, and the teacher's
    chunks = len(rows_now) // heads
    assert chunks >= 2  # several chunks
    assert len(rows_then) == 2 * heads * chunks  # checkpointed: each chunk's forward again in backward
    (_, bf16_now, *_), (_, bf16_then, *_) = run(True, torch.bfloat16), run(False, torch.bfloat16)
    error_now, error_then = ((g - then).norm() / then.norm() for g in (bf16_now, bf16_then))
    assert error_now <= 1.1 * error_then, (error_now, error_then)


def test_consistency_is_zero_when_noisy_equals_clean():
    model = TINY_MODELS["qwen2"]()
    clean = [[11, 12, 13, 14], [15, 16, 17, 18]]
    same = PackedExample("s", [5, 6], 4, noisy=[list(c) for c in clean], clean=clean, lengths=[4, 4])
    batch = collate([same], PAD)
    logits = model(
        input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
    ).logits
    for cfg in (JFLossConfig(), JFLossConfig(consistency="tv"), JFLossConfig(consistency="fixed_point")):
        _, m = jf_losses(logits, lambda rows: rows, batch, cfg)
        assert m["consistency_loss"] == 0.0 and m["consistency_positions"] == 0.0
    # a noisy copy whose history is identical but whose own tokens agree gives KL exactly 0 at kept positions too
    forced = dict(batch)
    forced["cons_student"] = torch.tensor([[2 + 4 + 4 + 1]])  # N_1[1]
    forced["cons_teacher"] = torch.tensor([[2 + 4 + 4 + 4 + 1]])  # C_1[1]
    forced["cons_valid"] = torch.tensor([[True]])
    _, m = jf_losses(logits, lambda rows: rows, forced, JFLossConfig())
    assert m["consistency_loss"] == pytest.approx(0.0, abs=1e-6)


def test_total_variation_is_half_the_l1_distance_between_the_copies_distributions():
    """`consistency: tv`: at each position the loss scores, 1/2 sum |p - q| of the clean copy's (teacher) and the
    noisy copy's (student) next-token distributions, averaged over the positions; its gradient reaches the student
    only."""
    model = TINY_MODELS["qwen2"]()
    clean = [[11, 12, 13, 14], [15, 16, 17, 18]]
    noisy = [[11, 30, 31, 32], [15, 33, 34, 35]]
    batch = collate([PackedExample("s", [5, 6], 4, noisy=noisy, clean=clean, lengths=[4, 4])], PAD)
    logits = model(
        input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
    ).logits
    loss, m = jf_losses(logits, lambda rows: rows, batch, JFLossConfig(consistency="tv", ar_weight=0.0))
    valid = batch["cons_valid"][0]
    student = logits[0, batch["cons_student"][0][valid]].softmax(-1)
    teacher = logits[0, batch["cons_teacher"][0][valid]].softmax(-1)
    per_position = 0.5 * (student - teacher).abs().sum(-1)
    assert m["consistency_positions"] == valid.sum() > 0 and (per_position > 0).all() and (per_position <= 1).all()
    assert m["consistency_loss"] == pytest.approx(float(per_position.detach().mean()), rel=1e-5)
    (grad,) = torch.autograd.grad(loss, logits)
    at = grad[0].abs().sum(-1)
    assert (at[batch["cons_student"][0][valid]] > 0).all() and (at[batch["cons_teacher"][0][valid]] == 0).all()


def test_the_old_hard_targets_key_is_refused_with_its_new_spelling():
    from jf_core.training.config import JFTrainConfig

    with pytest.raises(ValueError, match="consistency: fixed_point"):
        JFTrainConfig.model_validate({"hard_targets": True})
    assert JFTrainConfig(consistency="tv").consistency == "tv"


@pytest.mark.parametrize("variant", ["shipped", "clean_context"])
def test_flex_mask_mod_states_the_same_rule(variant):
    from jf_core.training.mask import mask_mod

    kinds, blocks, copies = zip(*(layout(p, n, t, 50, c) for p, n, t, c in ((3, 4, 3, 1), (7, 2, 5, 3))), strict=True)
    kind, block, copy = torch.stack(kinds), torch.stack(blocks), torch.stack(copies)
    mod = mask_mod(kind, block, variant, copy)
    q = torch.arange(50)[:, None].expand(50, 50)
    k = torch.arange(50)[None, :].expand(50, 50)
    dense = build_mask(kind, block, variant, copy)
    for b in range(2):
        assert torch.equal(mod(torch.full_like(q, b), 0, q, k), dense[b, 0])
    assert copy[1].max() == 2 and not torch.equal(dense[1, 0], build_mask(kind, block, variant)[1, 0])


@pytest.mark.parametrize("form", ["build_mask", "mask_mod"])
def test_both_forms_of_the_mask_refuse_a_variant_they_do_not_know(form):
    """The FlexAttention form read a misspelt variant as the shipped rule (only the dense form checked the name)."""
    from jf_core.training import mask

    kind, block, _ = layout(3, 2, 4, 20)
    with pytest.raises(ValueError, match="unknown mask variant 'clean-context'"):
        getattr(mask, form)(kind[None], block[None], "clean-context")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flex_attention_training_forward_equals_sdpa_on_gpu():
    from jf_core.training.losses import JacobiForcingObjective, JFLossConfig

    model = TINY_MODELS["qwen2"]().cuda()
    g = torch.Generator().manual_seed(0)
    clean = [torch.randint(3, 500, (8,), generator=g).tolist() for _ in range(3)]
    noisy = [[c[0], *torch.randint(3, 500, (7,), generator=g).tolist()] for c in clean]
    batch = {k: v.cuda() for k, v in collate([PackedExample("e", [5, 6, 7], 8, noisy, clean, [8] * 3)], PAD).items()}
    model.set_attn_implementation("sdpa")
    _, sdpa = JacobiForcingObjective(JFLossConfig())(model, batch)
    model.set_attn_implementation("flex_attention")
    _, flex = JacobiForcingObjective(JFLossConfig())(model, batch)
    assert flex["ar_loss"] == pytest.approx(sdpa["ar_loss"], abs=1e-4)
    assert flex["consistency_loss"] == pytest.approx(sdpa["consistency_loss"], abs=1e-4)


def cllm_reference_consistency(model, ex: PackedExample, cfg: JFLossConfig) -> torch.Tensor:
    """CLLM's loss written as CLLM computes it: per block j, the student reads [prompt][fixed point < j][state of
    block j], the teacher reads [prompt][fixed point <= j] (a second forward), KL(teacher || student) on the block's
    positions from its first unconverged one."""
    p, n = len(ex.prompt), ex.n
    _, cons = loss_positions(ex)
    kls = []
    for j in range(ex.num_blocks):
        prefix = ex.prompt + [t for b in ex.clean[:j] for t in b]
        student = model(input_ids=torch.tensor([prefix + ex.noisy[j]])).logits[0]
        teacher = model(input_ids=torch.tensor([prefix + ex.clean[j]])).logits[0]
        for s, _t, _ in cons:
            if ex.noisy_start(j) <= s < ex.noisy_start(j) + n:
                at = p + j * n + (s - ex.noisy_start(j))
                log_t = torch.log_softmax(teacher[at] / cfg.temperature, -1)
                log_s = torch.log_softmax(student[at] / cfg.temperature, -1)
                kls.append((log_t.exp() * (log_t - log_s)).sum() * cfg.temperature**2)
    return torch.stack(kls).mean()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_cllm_baseline_in_one_packed_pass_is_cllms_two_forward_loss(arch):
    """training.method cllm: packed with the clean_context mask, one forward computes exactly CLLM's per-block
    consistency loss (a separate student and teacher forward per block), so the baseline runs in the same loop."""
    model = TINY_MODELS[arch]()
    examples = _random_examples(seed=1, shapes=((3, 3), (5, 2)))
    cfg = JFLossConfig(temperature=1.0, chunk=3)
    batch = collate(examples, PAD, "clean_context")
    with torch.no_grad():
        _, metrics = JacobiForcingObjective(cfg, "clean_context")(model, batch)
        refs = [cllm_reference_consistency(model, e, cfg) for e in examples]
        _, shipped = JacobiForcingObjective(cfg, "shipped")(model, collate(examples, PAD, "shipped"))
    n_cons = [len(loss_positions(e)[1]) for e in examples]
    expected = sum(r * k for r, k in zip(refs, n_cons, strict=True)) / sum(n_cons)
    assert metrics["consistency_loss"] == pytest.approx(expected.item(), abs=1e-5)
    assert shipped["consistency_loss"] != pytest.approx(expected.item(), abs=1e-3)  # noisy context differs


def test_cllm_packing_draws_intermediate_states_uniformly():
    from jf_core.config import JFTrainConfig

    schedule = NoiseSchedule.of(JFTrainConfig(method="cllm", mask="clean_context", seed=3))
    states = [[1, 9, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9], [1, 2, 3, 4]]
    recs = [record(f"p{i}", 0, states, [1, 2, 3, 4]) for i in range(300)]
    recs.append(record("converged", 0, [[1, 2, 3, 4]], [1, 2, 3, 4]))
    packed, _ = pack_records(recs, schedule, max_length=64)
    picks = [tuple(e.noisy[0]) for e in packed if e.prompt_id != "converged"]
    counts = {tuple(s): picks.count(tuple(s)) for s in states}
    assert counts[(1, 2, 3, 4)] == 0 and all(80 <= counts[tuple(s)] <= 120 for s in states[:3]), counts
    assert next(e for e in packed if e.prompt_id == "converged").noisy == [[1, 2, 3, 4]]
    again, _ = pack_records(recs, schedule, max_length=64)
    assert [e.noisy for e in again] == [e.noisy for e in packed]  # seeded


def test_each_visit_draws_every_state_again_reproducibly():
    """state_pick each_visit: visit 0 is packing's own pick, later visits draw the block's other states (a seeded
    schedule), the same draw for the same visit; a deterministic schedule keeps packing's pick; the batches
    `jf_batches` makes with `redraw` carry the drawn states."""
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.packing import redrawn

    states = [[1, 9, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9], [1, 2, 3, 4]]
    recs = [record("p", 0, states, [1, 2, 3, 4]), record("p", 1, [[5, 9, 9, 9], [5, 6, 7, 8]], [5, 6, 7, 8])]
    for schedule in (NoiseSchedule("uniform_state", seed=2), NoiseSchedule("random", window=4, seed=2)):
        (ex,), _ = pack_records(recs, schedule, max_length=64)
        assert ex.states == [states, [[5, 9, 9, 9], [5, 6, 7, 8]]]
        assert redrawn(ex, schedule, 0).noisy == ex.noisy
        draws = [tuple(redrawn(ex, schedule, v).noisy[0]) for v in range(1, 60)]
        assert len(set(draws)) >= 3, draws
        assert draws == [tuple(redrawn(ex, schedule, v).noisy[0]) for v in range(1, 60)]
    progressive = NoiseSchedule("progressive", window=2)
    (ex,), _ = pack_records(recs, progressive, max_length=64)
    assert all(redrawn(ex, progressive, v).noisy == ex.noisy for v in range(5))
    schedule = NoiseSchedule("uniform_state", seed=2)
    (ex,), _ = pack_records(recs, schedule, max_length=64)
    batches = jf_batches([ex], 1, PAD, seed=0, redraw=schedule)
    p = len(ex.prompt)
    seen = [tuple(next(batches)["input_ids"][0, p : p + 4].tolist()) for _ in range(40)]
    assert seen[0] == tuple(ex.noisy[0]) and set(seen) == {tuple(s) for s in states[:3]}
    fixed = jf_batches([ex], 1, PAD, seed=0)
    assert {tuple(next(fixed)["input_ids"][0, p : p + 4].tolist()) for _ in range(10)} == {tuple(ex.noisy[0])}


@pytest.mark.parametrize(
    ("clean", "noisy", "named"),
    [
        (
            [[5, 6, 7, 8], [10, 2]],
            [[5, 6, 9, 9], [10, 2, 9, 9]],
            r"'e': clean blocks of \[4, 2\] tokens, not 2 blocks of n = 4",
        ),
        ([[5, 6, 7, 8, 9], [10, 2, 0]], [[5, 6, 9, 9], [10, 2, 9, 9]], r"clean blocks of \[5, 3\] tokens"),
        ([[5, 6, 7, 8], [10, 2, 0, 0]], [[5, 6, 9, 9], [10, 2]], r"'e': noisy copy 0 blocks of \[4, 2\] tokens"),
        ([[5, 6, 7, 8], [10, 2, 0, 0]], [[5, 6, 9, 9]], r"noisy copy 0 blocks of \[4\] tokens, not 2 blocks"),
    ],
)
def test_a_block_of_other_than_n_tokens_is_refused_where_the_example_is_made(clean, noisy, named):
    """Every layout puts block j at p + j * n: a short clean or noisy block would shift every position after it."""
    with pytest.raises(ValueError, match=named):
        PackedExample("e", [1, 3], 4, noisy, clean, [4, 2])
    made = PackedExample("e", [1, 3], 4, [[5, 6, 9, 9], [10, 2, 9, 9]], [[5, 6, 7, 8], [10, 2, 0, 0]], [4, 2])
    with pytest.raises(ValueError, match=r"noisy copy 1 blocks of \[4, 3\] tokens"):
        PackedExample("e", [1, 3], 4, made.noisy, made.clean, [4, 2], extra_noisy=[[[5, 6, 7, 9], [10, 2, 9]]])


def test_each_visit_refuses_examples_packed_without_their_states():
    from jf_core.training.packing import redrawn

    ex = PackedExample("old", [5, 6], 4, noisy=[[1, 9, 9, 9]], clean=[[1, 2, 3, 4]], lengths=[4])
    with pytest.raises(ValueError, match="'old' holds no states to draw from"):
        redrawn(ex, NoiseSchedule("random"), 1)


@pytest.mark.parametrize("lean", [True, False])
def test_base_kl_is_zero_at_the_base_and_pulls_a_moved_model_back(lean):
    """KL(base || model) at the AR positions: 0 while the model is the base (the loss is the plain one), positive once
    it moved, equal to a direct computation from full logits, and its gradient reaches the model only."""
    import copy

    import torch.nn.functional as F

    base = TINY_MODELS["qwen2"]()
    examples = _random_examples(seed=5, shapes=((3, 3), (5, 2)))
    batch = collate(examples, PAD)
    cfg = JFLossConfig(chunk=3, base_kl_weight=2.0)
    plain, _ = JacobiForcingObjective(JFLossConfig(chunk=3), lean=lean)(copy.deepcopy(base), batch)
    same, m = JacobiForcingObjective(cfg, lean=lean, base=copy.deepcopy(base))(copy.deepcopy(base), batch)
    assert m["base_kl"] == pytest.approx(0.0, abs=1e-6) and same.item() == pytest.approx(plain.item(), abs=1e-6)

    moved = copy.deepcopy(base).train()
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    frozen = copy.deepcopy(base)
    loss, m = JacobiForcingObjective(cfg, lean=lean, base=frozen)(moved, batch)
    kwargs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}
    with torch.no_grad():
        valid = batch["ar_tgt"] != -100
        rows = lambda logits: torch.gather(  # noqa: E731
            logits, 1, batch["ar_src"][..., None].expand(-1, -1, logits.shape[-1])
        )[valid]
        want = F.kl_div(
            F.log_softmax(rows(moved(**kwargs).logits.float()), -1),
            F.log_softmax(rows(base(**kwargs).logits.float()), -1),
            log_target=True,
            reduction="batchmean",
        )
    assert m["base_kl"] == pytest.approx(want.item(), rel=1e-4) and m["base_kl"] > 1e-4
    loss.backward()
    assert all(p.grad is None for p in frozen.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in moved.parameters())


def test_base_kl_needs_its_base_and_one_process():
    from jf_core.config import JFTrainConfig

    with pytest.raises(ValueError, match="frozen base model"):
        JacobiForcingObjective(JFLossConfig(base_kl_weight=1.0))
    with pytest.raises(ValueError, match="base_kl_weight keeps a whole frozen copy"):
        JFTrainConfig(base_kl_weight=1.0, strategy="fsdp2")
    assert (
        JacobiForcingObjective.of(JFTrainConfig(base_kl_weight=1.0), base=TINY_MODELS["qwen2"]()).cfg.base_kl_weight
        == 1.0
    )


@pytest.mark.parametrize("mask", ["clean_context", "shipped"])
def test_a_draft_adapter_sees_in_one_pass_what_it_drafts_on_in_decoding(mask):
    """With the packed draft gate, each noisy block's logits are those of a separate forward over [prompt][what
    comes before it][its state], the adapter on the drafted tokens only: under clean_context the fixed points before
    it (plain Jacobi's chain: the base's cache and window root, the adapter on the rest); under the shipped mask the
    noisy states before it, drafted by the adapter too (multi-block's chain, whose next block is drafted on a block
    still in flight). The clean copies are the base's. Only the adapter learns."""
    from jf_core.draft_adapter.adapter import gated
    from jf_core.training.losses import _forward_kwargs
    from jf_core.training.packing import draft_positions

    model, adapter = adapter_model("qwen2")
    base = TINY_MODELS["qwen2"]()
    ex = _random_examples(0, ((3, 2),))[0]
    ex.noisy[1][1] = ex.clean[1][1]  # block 1 agrees with its fixed point through offset 1
    n0, n1 = ex.noisy_start(0), ex.noisy_start(1)
    assert draft_positions(ex) == [n0 + 1, n0 + 2, n0 + 3, n1 + 2, n1 + 3]
    batch = collate([ex], PAD, mask)
    with torch.no_grad(), gated(model, batch["draft_gate"]):
        one_pass = model(**_forward_kwargs(model, batch, mask)).logits[0]
    p = len(ex.prompt)
    for j in range(ex.num_blocks):
        before, drafted = (ex.clean[:j], [j]) if mask == "clean_context" else (ex.noisy[:j], range(j + 1))
        seq = ex.prompt + [t for c in before for t in c] + ex.noisy[j]
        gate = torch.zeros(1, len(seq))
        for pos, i in itertools.product(draft_positions(ex), drafted):
            if ex.noisy_start(i) <= pos < ex.noisy_start(i) + ex.n:
                gate[0, p + i * ex.n + pos - ex.noisy_start(i)] = 1.0
        with torch.no_grad(), gated(model, gate):
            alone = model(input_ids=torch.tensor([seq])).logits[0]
        torch.testing.assert_close(one_pass[ex.noisy_start(j) : ex.noisy_start(j) + ex.n], alone[-ex.n :])
        clean_seq = ex.prompt + [t for c in ex.clean[: j + 1] for t in c]
        with torch.no_grad():
            clean_alone = base(input_ids=torch.tensor([clean_seq])).logits[0]
        torch.testing.assert_close(one_pass[ex.clean_start(j) : ex.clean_start(j) + ex.n], clean_alone[-ex.n :])

    loss, _ = JacobiForcingObjective(JFLossConfig(), mask, lean=True)(model, batch)
    loss.backward()
    assert all(p.grad is None for name, p in model.named_parameters() if not name.startswith("jf_draft_adapter."))
    assert all(b.grad is not None and b.grad.abs().sum() > 0 for b in adapter.b.values())


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"mask": "clean_context", "strategy": "ddp"}, "training.strategy"),
        ({"mask": "clean_context", "activation_checkpointing": True}, "training.activation_checkpointing"),
        ({"mask": "clean_context", "base_kl_weight": 1.0}, "training.base_kl_weight"),
    ],
)
def test_a_draft_adapter_refuses_what_would_train_it_wrong_by_name(fields, named):
    from jf_core.config import JFTrainConfig

    with pytest.raises(ValueError, match=f"training.draft_lora with {named}"):
        JFTrainConfig(draft_lora={"rank": 8}, **fields)
    JFTrainConfig(draft_lora={"rank": 8}, mask="clean_context")
    JFTrainConfig(draft_lora={"rank": 8}, mask="shipped")  # multi-block's mask (issue 50, item 5)
    with pytest.raises(ValueError, match=r"draft_lora\.rank"):  # the section's own fields are checked by name
        JFTrainConfig(draft_lora={"rank": 0}, mask="clean_context")
    with pytest.raises(ValueError, match=r"one section now: training\.draft_lora: \{rank: 16, alpha: 32\}"):
        JFTrainConfig(draft_lora_rank=16, draft_lora_alpha=32, mask="clean_context")  # the old spelling


def test_the_trainer_steps_the_adapter_alone_under_bf16_autocast():
    """The round's loop (AdamW on fp32 masters, bf16 compute as on a GPU, weight decay): the frozen base comes out
    bit for bit as it went in, the adapter moves, and the consistency loss falls."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.trainer import TrainConfig, train

    model = TINY_MODELS["qwen2"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    examples = _random_examples(3, ((3, 2), (5, 3)))
    batches = jf_batches(examples, 2, PAD, seed=0, variant="clean_context")
    objective = JacobiForcingObjective(JFLossConfig(), "clean_context")
    cfg = TrainConfig(steps=12, lr=1e-2, warmup_steps=1, log_every=1, compute_dtype=torch.bfloat16)
    result = train(model, batches, objective, cfg, progress=False)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert all(b.abs().sum() > 0 for b in adapter.b.values())
    losses = [row["consistency_loss"] for row in result.history]
    assert losses[-1] < losses[0]


def test_an_adapter_run_resumes_from_its_checkpoint_to_the_same_adapter(tmp_path):
    """A checkpoint holds the adapter and its optimizer state, not the frozen base (the run's input model, loaded
    before a resume; a 135M base made every checkpoint 570 MB): a run that died resumes, on a fresh model with a
    fresh adapter, to the adapter an uninterrupted run reaches; so does one from a checkpoint written whole, as they
    were before. A model that trains other weights is refused the adapter's."""
    import shutil

    from safetensors.torch import load_file, save_file

    from jf_core.checksums import write_manifest
    from jf_core.draft_adapter.adapter import ATTRIBUTE, attach_draft_adapter
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.parallel import Parallel, _trained_weights
    from jf_core.training.trainer import Checkpoints, Every, TrainConfig, train

    examples = _random_examples(4, ((3, 2), (5, 3)))
    cfg = TrainConfig(steps=8, lr=1e-2, warmup_steps=1, log_every=1)

    def run(seed: int, **kw):
        model = TINY_MODELS["qwen2"]()
        torch.manual_seed(seed)  # a different random A in every fresh adapter
        attach_draft_adapter(model, DraftLora(rank=4))
        batches = jf_batches(examples, 2, PAD, seed=0, variant="clean_context")
        train(model, batches, JacobiForcingObjective(JFLossConfig(), "clean_context"), cfg, progress=False, **kw)
        return model

    straight = run(0)

    def crash_after_5(step, row):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(0, hooks=[Checkpoints(tmp_path, Every(3))], on_log=crash_after_5)
    (checkpoint,) = tmp_path.glob("step-*")
    held = load_file(str(checkpoint / "model.safetensors"))
    trained = {n for n, p in straight.named_parameters() if p.requires_grad}
    assert set(held) == trained and all(n.startswith(ATTRIBUTE) for n in held)
    resumed = run(1, hooks=[Checkpoints(tmp_path, Every(3))])
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    whole = TINY_MODELS["qwen2"]()  # trains every weight: the adapter's checkpoint lacks all of them
    with pytest.raises(ValueError, match="does not match the model"):
        Parallel().load_checkpoint(checkpoint, whole, torch.optim.AdamW(whole.parameters()))

    # A checkpoint written whole, as they were before (the frozen base's weights beside the adapter's), resumes too.
    old = tmp_path / "written_whole" / checkpoint.name
    shutil.copytree(checkpoint, old)
    save_file({**_trained_weights(TINY_MODELS["qwen2"]()), **held}, str(old / "model.safetensors"))
    write_manifest(old)
    again = run(1, hooks=[Checkpoints(old.parent, Every(3))])
    for (name, a), (_, b) in zip(straight.state_dict().items(), again.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("mask", ["clean_context", "shipped"])
def test_each_noisy_copy_is_trained_as_its_own_packing_would_train_it(mask):
    """training.noisy_copies: an example packed with three noisy copies of its blocks gives each copy's positions the
    logits they get packed alone ([prompt][N^c_0][C_0][N^c_1][C_1]...: the same context, seen once), so the
    consistency loss is the copies' own losses weighted by their positions, in one pass and in the draft adapter's
    two passes alike, and the adapter's gradient is theirs."""
    from dataclasses import replace

    from jf_core.training.packing import draft_positions

    model, adapter = adapter_model("qwen2")
    ex = _random_examples(0, ((3, 3),))[0]
    extra = [_random_examples(seed, ((3, 3),))[0].noisy for seed in (1, 2)]
    for copy in extra:
        for j, noisy in enumerate(copy):
            noisy[0] = ex.clean[j][0]  # a Jacobi block's first token is always right
    extra[1][2] = list(ex.clean[2])  # one block at its fixed point: nothing to learn there
    together = replace(ex, extra_noisy=extra)
    alone = [replace(ex, noisy=noisy) for noisy in [ex.noisy, *extra]]
    assert together.copies == 3 and together.total_length == 3 + 4 * 3 * 4
    assert together.position_ids()[-12:] == ex.position_ids()[3:7] + ex.position_ids()[11:15] + ex.position_ids()[19:23]
    cons = [len(loss_positions(e)[1]) for e in alone]
    assert len(loss_positions(together)[1]) == sum(cons) and cons[2] == 6  # 3 a block, block 2 none
    assert len(draft_positions(together)) == sum(len(draft_positions(e)) for e in alone)

    batch = collate([together], PAD, mask)
    with torch.no_grad(), gated_forward(model, batch, mask) as logits:
        starts = [start for _, _, start in together.noisy_blocks()]
        for c, single in enumerate(alone):
            single_batch = collate([single], PAD, mask)
            with gated_forward(model, single_batch, mask) as want:
                for j in range(ex.num_blocks):
                    got = logits[0, starts[c * ex.num_blocks + j] :][: ex.n]
                    torch.testing.assert_close(got, want[0, single.noisy_start(j) :][: ex.n])

    def step(b, context_cache):
        model.zero_grad(set_to_none=True)
        loss, metrics = JacobiForcingObjective(JFLossConfig(chunk=5), mask, context_cache=context_cache)(model, b)
        loss.backward()
        return metrics["consistency_loss"], torch.cat([p.grad.flatten() for p in adapter.parameters()])

    singles = [step(collate([e], PAD, mask), False) for e in alone]
    want_loss = sum(loss * k for (loss, _), k in zip(singles, cons, strict=True)) / sum(cons)
    for context_cache in (False, True):
        loss, grad = step(batch, context_cache)
        assert loss == pytest.approx(want_loss, rel=1e-5)
        # the packed loss is the positions' mean: its gradient, the singles' weighted by their positions
        want_grad = sum(g * k for (_, g), k in zip(singles, cons, strict=True)) / sum(cons)
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)


@contextlib.contextmanager
def gated_forward(model, batch, mask):
    from jf_core.draft_adapter.adapter import gated
    from jf_core.training.losses import _forward_kwargs

    with gated(model, batch["draft_gate"]):
        yield model(**_forward_kwargs(model, batch, mask)).logits


def test_noisy_copies_are_drawn_per_visit_and_fit_the_packing():
    """Each visit draws K copies as K consecutive draws (one copy: the draws as before), reproducibly; packing fits
    as many blocks as K copies leave room for; the config and the batches refuse copies without each_visit."""
    from jf_core.training.config import JFTrainConfig
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.packing import redrawn

    states = [[1, 9, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9], [1, 2, 3, 4]]
    recs = [record("p", 0, states, [1, 2, 3, 4]), record("p", 1, [[5, 9, 9, 9], [5, 6, 7, 8]], [5, 6, 7, 8])]
    schedule = NoiseSchedule("uniform_state", seed=2)
    (ex,), _ = pack_records(recs, schedule, max_length=64)
    three = redrawn(ex, schedule, 4, copies=3)
    assert three.copies == 3 and len(three.extra_noisy[0]) == ex.num_blocks
    assert [three.noisy, *three.extra_noisy] == [redrawn(ex, schedule, v).noisy for v in (12, 13, 14)]
    assert redrawn(ex, schedule, 4, copies=3) == three
    (short,), stats = pack_records(recs, schedule, max_length=len(ex.prompt) + 3 * 4, copies=2)
    assert short.num_blocks == 1 and stats.dropped_blocks == {"max_length": 1}
    batch = next(jf_batches([ex], 1, PAD, seed=0, redraw=schedule, copies=3))
    assert batch["input_ids"].shape[1] == len(ex.prompt) + 4 * 2 * 4 and batch["layout_copy"].max() == 2
    with pytest.raises(ValueError, match="set state_pick: each_visit"):
        next(jf_batches([ex], 1, PAD, seed=0, copies=2))
    with pytest.raises(ValueError, match=r"training.noisy_copies > 1"):
        JFTrainConfig(noisy_copies=2)
    assert JFTrainConfig(noisy_copies=2, state_pick="each_visit").noisy_copies == 2


@pytest.mark.parametrize("span", [1, 2, 3])
def test_a_drafted_span_takes_the_first_positions_from_the_departure(span):
    """training.draft_span K: the consistency loss's students and the draft gate are each noisy block's first K
    positions from its first departure (the slots a K-slot draft chain reads), post-EOS positions still left out."""
    clean = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 2, 0, 0]]  # the second block ends at EOS (2): length 4
    noisy = [[5, 6, 40, 41, 42, 43], [11, 44, 45, 46, 47, 48]]
    ex = PackedExample("e", [1, 3], 6, noisy, clean, [6, 4])
    _, whole = loss_positions(ex)
    _, spanned = loss_positions(ex, span)
    offsets = {
        j: [s - ex.noisy_start(j) for s, _, _ in spanned if ex.noisy_start(j) <= s < ex.clean_start(j)] for j in (0, 1)
    }
    assert offsets[0] == list(range(2, 2 + span))
    assert offsets[1] == [t for t in range(1, 1 + span) if t + 1 < 4]  # t predicts a valid token
    assert set(spanned) <= set(whole) and len(whole) == 4 + 2
    gate = [s - ex.noisy_start(0) for s in draft_positions(ex, span) if s < ex.clean_start(0)]
    assert gate == list(range(2, 2 + span))
    assert draft_positions(ex) == [
        *range(ex.noisy_start(0) + 2, ex.noisy_start(0) + 6),
        *range(ex.noisy_start(1) + 1, ex.noisy_start(1) + 6),
    ]


def test_training_attention_is_flex_on_cuda_unless_the_profile_names_another():
    """`training.attention`: auto is FlexAttention's block masks on CUDA and SDPA's dense mask elsewhere; a profile
    naming a kernel gets it on every device (sdpa on CUDA: the way back when FlexAttention's compile fails there).
    Only a named kernel enters the round's key, so rounds trained before the knob keep theirs."""
    from jf_core.config import load_profile
    from jf_core.round.paths import training_identity
    from jf_core.training.config import JFTrainConfig
    from jf_core.training.losses import training_attention

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert (training_attention(cuda), training_attention(cpu)) == ("flex_attention", "sdpa")
    assert (training_attention(cuda, "sdpa"), training_attention(cpu, "flex_attention")) == ("sdpa", "flex_attention")
    auto = load_profile("tiny")
    named = auto.model_copy(update={"training": auto.training.model_copy(update={"attention": "sdpa"})})
    assert "attention" not in training_identity(auto) and training_identity(named)["attention"] == "sdpa"
    with pytest.raises(ValueError, match="attention"):
        JFTrainConfig(attention="flash_attention_2")
