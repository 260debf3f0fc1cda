"""Training on 2 CPU workers (gloo) through Ray Train, with the project's one loop: DDP and FSDP2 follow the
one-process loss curve on the same global batches; a worker killed mid-run resumes from the last sharded
checkpoint and ends with the weights of an uninterrupted run; the consolidated model loads and decodes losslessly."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
import torch
from safetensors.torch import load_file

from jacobi_forcing.tasks.train_distributed import CHAOS_ENV, train_distributed
from jacobi_forcing.tasks.trajectories import generate_trajectories
from jf_core.config import JFTrainConfig
from jf_core.round.paths import RoundPaths
from jf_core.round.stages import stage_pack, stage_trajectories

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]

TRAINING = JFTrainConfig(steps=6, batch_size=2, warmup_steps=1, lr=1e-3, checkpoint_every=2, grad_clip=1e9)


@pytest.fixture(scope="module")
def packed(profile, tmp_path_factory):
    """The test profile's trajectories and packed examples, made as a round makes them."""
    root = tmp_path_factory.mktemp("round")
    p = profile.model_copy(update={"training": TRAINING})
    paths = RoundPaths(root)
    trajectories = stage_trajectories(p, p.model.path, paths, collect=partial(generate_trajectories, progress=False))
    stage_pack(p, paths, trajectories)
    return p, paths


def run_dir(paths: RoundPaths, tmp_path, name: str) -> RoundPaths:
    """A fresh round directory with the same packed examples (its own checkpoints and model)."""
    root = tmp_path / name
    (root / "packed").mkdir(parents=True)
    shutil.copy(paths.packed / "examples.parquet", root / "packed" / "examples.parquet")
    return RoundPaths(root)


def distributed(profile, strategy: str):
    return profile.model_copy(
        update={
            "training": profile.training.model_copy(update={"strategy": strategy}),
            "compute": profile.compute.model_copy(update={"train_workers": 2}),
        }
    )


def weights(paths: RoundPaths) -> dict[str, torch.Tensor]:
    return load_file(str(paths.model / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(packed, tmp_path_factory):
    """The one-process reference on the workers' global batches, then DDP and FSDP2 on 2 workers."""
    from jf_core.models import load_model
    from jf_core.training.jf_data import global_batches, read_packed_share
    from jf_core.training.losses import JacobiForcingObjective
    from jf_core.training.trainer import TrainConfig, train

    profile, paths = packed
    tmp = tmp_path_factory.mktemp("runs")
    model, tok = load_model(profile.model.path, dtype="float32")
    shares = [read_packed_share(paths.packed / "examples.parquet", rank, 2) for rank in range(2)]
    t = profile.training
    batches = global_batches(shares, t.batch_size, tok.pad_token_id, seed=t.seed, variant=t.mask)
    single = train(model.train(), batches, JacobiForcingObjective.of(t), TrainConfig.of(t, log_every=1), progress=False)
    out = {"single": ([h["loss"] for h in single.history], {k: v.detach() for k, v in model.state_dict().items()})}
    for strategy in ("ddp", "fsdp2"):
        target = run_dir(paths, tmp, strategy)
        summary = train_distributed(distributed(profile, strategy), target, profile.model.path)
        out[strategy] = (summary, target)
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_ddp_and_fsdp2_follow_the_one_process_loss_curve(runs, strategy):
    losses, state = runs["single"]
    summary, target = runs[strategy]
    assert summary.strategy == strategy and summary.workers == 2 and summary.resumed_from_step == 0
    got = [h["loss"] for h in summary.history]
    assert got == pytest.approx(losses, rel=2e-4), (got, losses)  # fp32, token-weighted over both workers
    trained = weights(target)
    for name, value in trained.items():
        torch.testing.assert_close(value, state[name], rtol=1e-3, atol=1e-5, msg=f"{strategy} {name}")


@pytest.mark.faults
def test_a_killed_worker_resumes_from_its_checkpoint_with_the_uninterrupted_weights(
    packed, runs, tmp_path, monkeypatch
):
    profile, paths = packed
    marker = tmp_path / "died"
    monkeypatch.setenv(CHAOS_ENV, f"1:4:{marker}")  # worker 1 dies right after step 4; checkpoints every 2 steps
    target = run_dir(paths, tmp_path, "killed")
    summary = train_distributed(distributed(profile, "fsdp2"), target, profile.model.path)
    assert marker.read_text() == "rank 1 died after step 4"
    assert summary.resumed_from_step == 4  # Ray Train restarted both workers; they resumed at the step-4 shards
    uninterrupted = weights(runs["fsdp2"][1])
    for name, value in weights(target).items():
        torch.testing.assert_close(value, uninterrupted[name], rtol=1e-5, atol=1e-6, msg=name)
    assert [h["loss"] for h in summary.history] == pytest.approx([h["loss"] for h in runs["fsdp2"][0].history])


def test_the_consolidated_model_loads_and_decodes_losslessly(runs):
    from jf_core.decoding.ar import ar_decode
    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
    from jf_core.models import load_model, stop_tokens

    _, target = runs["fsdp2"]
    model, tok = load_model(str(target.model))
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("program: a=5; step +3; return d", "a=1")]
    stop = stop_tokens(model, tok)
    want = ar_decode(model, prompts, max_new_tokens=24, stop=stop).sequences
    got = jacobi_decode(model, prompts, JacobiConfig(block_size=8, max_new_tokens=24), stop=stop).sequences
    assert got == want
