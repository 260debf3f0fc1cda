from __future__ import annotations

import itertools

import pytest
import torch

from jf_core.checkpoint import save_checkpoint
from jf_core.training.trainer import NonFiniteLossError, TrainConfig, causal_lm_loss, lr_at, train
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

    def broken(model, batch):
        loss, _ = causal_lm_loss(model, batch)
        return loss * float("nan"), {}

    with pytest.raises(NonFiniteLossError, match="step 0"):
        train(model, batches(), broken, TrainConfig(steps=3, warmup_steps=0), progress=False)


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
            checkpoint_dir=tmp_path,
            checkpoint_every=3,
            on_log=crash_after_5,
            progress=False,
        )
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-00000003"]
    resumed = TINY_MODELS["qwen2"]().train()  # fresh weights: everything must come from the checkpoint
    result = train(
        resumed, varying_batches(), causal_lm_loss, cfg, checkpoint_dir=tmp_path, checkpoint_every=3, progress=False
    )
    assert [h["step"] for h in result.history] == list(map(float, range(8)))
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000006", "step-00000008"]
