"""Jacobi Forcing training on many workers: the project's one training loop inside a Ray Train `TorchTrainer`.

DDP (gloo on CPU, NCCL on GPU) through `ray.train.torch.prepare_model`. Workers receive paths, not tensors: each
reads the trajectory store, packs it with the same schedule (deterministic), and takes every world_size-th example
starting at its rank. Rank 0 writes the model directory (atomically) at the end; checkpoints and resume work as in
the single-process trainer when `checkpoint_dir` sits on storage all workers share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from infra.ray_cluster import loopback_torch_config, ray_session
from jf_core.config import Profile


def _worker_loop(config: dict) -> None:
    import json

    import ray.train
    import torch
    from ray.train.torch import prepare_model

    from jf_core.checkpoint import save_checkpoint
    from jf_core.config import Profile
    from jf_core.models import load_model
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.losses import training_attention
    from jf_core.training.packing import pack_records
    from jf_core.training.trainer import train
    from jf_core.trajectory.store import TrajectoryStore

    profile = Profile.model_validate(config["profile"])
    t = profile.training
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(config["threads"])))
    device = ray.train.torch.get_device()
    model, tok = load_model(
        config["model_in"],
        dtype=profile.model.dtype,
        device=str(device),
        attn_implementation=training_attention(device),
    )
    records = TrajectoryStore(config["trajectories"]).read().to_pylist()
    packed, _ = pack_records(records, t.noise_schedule(), t.max_length)
    mine = packed[rank::world]
    ddp = prepare_model(model)
    batches = jf_batches(mine, t.batch_size, tok.pad_token_id, seed=t.seed + rank, variant=t.mask)

    last: dict = {}

    def report(step: int, row: dict) -> None:
        last.update(row, rank=rank, world_size=world)
        ray.train.report(dict(last))

    train(ddp, batches, t.objective(), t.loop(log_every=1), on_log=report, progress=False)
    if rank == 0:
        save_checkpoint(model, Path(config["out"]), tokenizer=tok, extra_files={"train_metrics.json": json.dumps(last)})


def train_distributed(
    profile: Profile,
    trajectories: str | Path,
    model_in: str,
    out: str | Path,
    *,
    num_workers: int = 2,
    use_gpu: bool = False,
    storage: str | Path | None = None,
) -> dict:
    """Train on `num_workers` Ray Train workers; returns rank 0's last logged metrics (also in train_metrics.json)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cpus = max(1, int(profile.compute.cpus_per_worker))
    with ray_session(profile.compute.ray_address, num_cpus=max(os.cpu_count() or 1, num_workers * cpus)) as session:
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config={
                "profile": profile.model_dump(),
                "trajectories": str(trajectories),
                "model_in": model_in,
                "out": str(Path(out).resolve()),
                "threads": cpus,
            },
            # On a loopback Ray every worker is on this machine: its rendezvous stays on 127.0.0.1 too.
            torch_config=loopback_torch_config() if session.loopback else TorchConfig(),
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus}),
            run_config=RunConfig(
                name="jf-train", storage_path=str(Path(storage or Path(out).parent / "ray-train").resolve())
            ),
        )
        result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"distributed training failed: {result.error}")
    return json.loads((Path(out) / "train_metrics.json").read_text())
