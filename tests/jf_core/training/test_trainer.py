from __future__ import annotations

import itertools

import pytest
import torch

from jf_core.decoding.common import StopTokens
from jf_core.model_dir import save_checkpoint
from jf_core.training.trainer import (
    CausalLMLoss,
    Checkpoints,
    Every,
    NonFiniteLossError,
    Probe,
    TrainConfig,
    causal_lm_loss,
    lr_at,
    train,
)
from tests.conftest import TINY_MODELS


def batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (4, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    while True:
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(0.1)


def test_training_fits_a_fixed_batch_and_is_seeded():
    losses = []
    for _ in range(2):
        model = TINY_MODELS["qwen2"]().train()
        result = train(
            model,
            batches(),
            causal_lm_loss,
            TrainConfig(steps=30, lr=3e-3, warmup_steps=2, log_every=1),
            progress=False,
        )
        losses.append([h["loss"] for h in result.history])
    assert losses[0] == losses[1]
    assert losses[0][-1] < 0.5 * losses[0][0]


def test_non_finite_loss_stops_with_a_clear_error():
    model = TINY_MODELS["qwen2"]()

    class Broken(CausalLMLoss):
        def __call__(self, model, batch, norm):
            loss, metrics = super().__call__(model, batch, norm)
            return loss * float("nan"), metrics

    broken = Broken()

    with pytest.raises(NonFiniteLossError, match="step 0"):
        train(model, batches(), broken, TrainConfig(steps=3, lr=3e-3, warmup_steps=0), progress=False)


def test_checkpoint_replaces_atomically(tmp_path):
    model = TINY_MODELS["qwen2"]()
    out = tmp_path / "ckpt"
    save_checkpoint(model, out, extra_files={"a.txt": "1"})
    save_checkpoint(model, out, extra_files={"a.txt": "2"})
    assert (out / "a.txt").read_text() == "2"
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or old directories left

    class Exploding:
        def save_pretrained(self, path, **_):
            (path / "partial.bin").write_text("x")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(Exploding(), out)
    assert (out / "a.txt").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def varying_batches(seed=0):
    """A different batch every step, so a resume that does not fast-forward the stream ends elsewhere."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(3, 64, (4, 12), generator=g)
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def test_resume_reaches_the_same_weights(tmp_path):
    cfg = TrainConfig(steps=8, lr=3e-3, warmup_steps=2, log_every=1)
    straight = TINY_MODELS["qwen2"]().train()
    train(straight, varying_batches(), causal_lm_loss, cfg, progress=False)

    class Crash(Exception):
        pass

    def crash_after_5(step, row):
        if step == 5:
            raise Crash

    crashed = TINY_MODELS["qwen2"]().train()
    with pytest.raises(Crash):
        train(
            crashed,
            varying_batches(),
            causal_lm_loss,
            cfg,
            hooks=[Checkpoints(tmp_path, Every(3))],
            on_log=crash_after_5,
            progress=False,
        )
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-00000003"]
    resumed = TINY_MODELS["qwen2"]().train()  # fresh weights: everything must come from the checkpoint
    hooks = [Checkpoints(tmp_path, Every(3), keep=2)]  # a long run keeps its newest checkpoints only
    result = train(resumed, varying_batches(), causal_lm_loss, cfg, hooks=hooks, progress=False)
    assert [h["step"] for h in result.history] == list(map(float, range(8)))
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006", "step-00000008"]


def test_bf16_compute_keeps_fp32_master_weights_and_updates_like_fp32():
    """bf16 training steps fp32 masters (compute under autocast): at lr 1e-5 nearly every weight moves, as in fp32;
    stepping bf16 weights directly (where most such updates round away) is refused."""
    changed = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = TINY_MODELS["qwen2"]().train()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = TrainConfig(steps=20, lr=1e-5, warmup_steps=0, compute_dtype=dtype)
        train(model, batches(), causal_lm_loss, cfg, progress=False)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        moved = sum(int((p != before[n]).sum()) for n, p in model.named_parameters())
        changed[dtype] = moved / sum(p.numel() for p in model.parameters())
    assert changed[torch.float32] > 0.95 and changed[torch.bfloat16] > 0.95, changed
    assert abs(changed[torch.bfloat16] - changed[torch.float32]) < 0.02, changed
    with pytest.raises(ValueError, match=r"optimizer would step torch\.bfloat16 weights"):
        low = TINY_MODELS["qwen2"]().to(torch.bfloat16)
        train(low, batches(), causal_lm_loss, TrainConfig(steps=2, lr=3e-3, warmup_steps=0))


def test_a_step_is_the_same_token_weighted_mean_however_it_is_split():
    """Two micro-batches of different sizes accumulated into one step give the step of the one merged batch."""
    import copy

    def merged():
        first, second = next(batches(0)), next(batches(1))
        uneven = dict(second)
        uneven["labels"] = second["labels"].clone()
        uneven["labels"][:, :9] = -100  # fewer positions in the second micro-batch
        while True:
            yield {k: torch.cat([first[k], uneven[k]]) for k in first}
            yield first
            yield uneven

    base = TINY_MODELS["qwen2"]().train()
    stream = merged()
    whole = next(stream)
    parts = [next(stream), next(stream)]
    one, two = copy.deepcopy(base), copy.deepcopy(base)
    train(
        one, iter([whole]), causal_lm_loss, TrainConfig(steps=1, lr=3e-3, warmup_steps=0, grad_clip=1e9), progress=False
    )
    cfg = TrainConfig(steps=1, lr=3e-3, warmup_steps=0, grad_accum=2, grad_clip=1e9)
    result = train(two, iter(parts), causal_lm_loss, cfg, progress=False)
    for (n, a), b in zip(one.named_parameters(), two.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    assert result.history[0]["loss"] == pytest.approx(causal_lm_loss(base, whole)[0].item(), rel=1e-5)


def test_a_probe_measures_the_model_during_training_without_changing_what_it_learns():
    """The probe runs every `probe_every` steps and after the last, in eval mode, its figures merged into that
    step's history row; the losses and weights are those of a run without it (TPF against steps is read off the
    run it describes, not off a different one)."""
    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode

    runs = []
    for with_probe in (False, True):
        model = TINY_MODELS["qwen2"]().train()
        seen = []

        def probe(m, seen=seen):
            seen.append(m.training)
            out = jacobi_decode(m, [[5, 6, 7]], JacobiConfig(block_size=4, max_new_tokens=8), stop=StopTokens(None, 0))
            return {"probe_tpf_n4": out.stats.tpf}

        result = train(
            model,
            batches(),
            causal_lm_loss,
            TrainConfig(steps=7, lr=3e-3, warmup_steps=1, log_every=2),
            progress=False,
            hooks=[Probe(probe, Every(3))] if with_probe else (),
        )
        runs.append((result.history, {k: v.clone() for k, v in model.state_dict().items()}, seen, model.training))
    (plain, plain_weights, _, _), (probed, probed_weights, seen, training_after) = runs
    assert [r["loss"] for r in probed if "loss" in r] == [r["loss"] for r in plain]
    assert all(torch.equal(plain_weights[k], probed_weights[k]) for k in plain_weights)
    assert [r["step"] for r in probed if "probe_tpf_n4" in r] == [2.0, 5.0, 6.0]  # steps 3, 6 and the last (7)
    assert seen == [False, False, False] and training_after is False  # eval mode while probing; train() ends in eval
    assert all(r["probe_tpf_n4"] >= 1.0 for r in probed if "probe_tpf_n4" in r)


def test_a_hooks_figures_are_printed_as_they_come_when_progress_shows(capsys):
    """A long run's log says each probe's TPF when it is measured (hours before the final rows); a run without
    progress prints nothing."""

    def probe(m):
        return {"probe_tpf_n4": 1.25}

    for progress in (True, False):
        train(
            TINY_MODELS["qwen2"]().train(),
            batches(),
            causal_lm_loss,
            TrainConfig(steps=4, lr=3e-3, warmup_steps=1),
            progress=progress,
            hooks=[Probe(probe, Every(2))],
        )
        out = capsys.readouterr().out
        assert (out.splitlines() if progress else out) == (
            ["step 2: probe_tpf_n4 1.25", "step 4: probe_tpf_n4 1.25"] if progress else ""
        )


def test_the_tokens_trained_on_are_counted_from_the_batches_and_carried_across_a_resume(tmp_path):
    """`tokens_seen`: the packed tokens of every batch a step took (padding left out), in the logged rows and in the
    row a checkpoint keeps when its step was not logged, so a resumed run counts what an uninterrupted one does."""
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.losses import JacobiForcingObjective, JFLossConfig
    from jf_core.training.noise import NoiseSchedule
    from tests.conftest import PAD
    from tests.jf_core.training.test_spans import _examples

    examples = _examples(5, copies=2)  # spans of drawn lengths: the rows differ from visit to visit
    cfg = TrainConfig(steps=7, lr=1e-3, warmup_steps=1, log_every=4, grad_accum=2)
    objective = JacobiForcingObjective(JFLossConfig(), "clean_context")

    def stream(drawn: list[int]):
        kw = {"variant": "clean_context", "redraw": NoiseSchedule("random", seed=1), "copies": 2, "packing": "spans"}
        for batch in jf_batches(examples, 1, PAD, seed=0, span=2, **kw):
            drawn.append(int(batch["packed_tokens"]))
            yield batch

    drawn: list[int] = []
    straight = train(TINY_MODELS["qwen2"]().train(), stream(drawn), objective, cfg, progress=False)
    assert straight.history[-1]["tokens_seen"] == sum(drawn[: 7 * 2]) and len(set(drawn)) > 1
    assert [h["step"] for h in straight.history if "loss" in h] == [0.0, 4.0, 6.0]

    class Crash(Exception):
        pass

    def crash_at_4(step, row):
        if step == 4:
            raise Crash

    with pytest.raises(Crash):
        train(TINY_MODELS["qwen2"]().train(), stream([]), objective, cfg, hooks=[Checkpoints(tmp_path, Every(3))],
              on_log=crash_at_4, progress=False)  # fmt: skip
    resumed = train(TINY_MODELS["qwen2"]().train(), stream([]), objective, cfg,
                    hooks=[Checkpoints(tmp_path, Every(3))], progress=False)  # fmt: skip
    kept = [h for h in resumed.history if h["step"] == 2.0]  # the checkpoint's step, not a logged one
    assert kept and kept[0]["tokens_seen"] == sum(drawn[: 3 * 2])
    assert resumed.history[-1]["tokens_seen"] == straight.history[-1]["tokens_seen"]
