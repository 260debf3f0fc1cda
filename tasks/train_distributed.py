"""Jacobi Forcing training on many workers: the project's one training loop inside a Ray Train `TorchTrainer`.

- `training.strategy: ddp`: a full replica per worker (DDP, `ray.train.torch.prepare_model`; gloo on CPU, NCCL on
  GPUs).
- `training.strategy: fsdp2`: `fully_shard` on each decoder layer, then the model: fp32 master weights and
  optimizer state sharded over the workers, compute in the model's dtype, gradients reduced in fp32, activation
  checkpointing with `training.activation_checkpointing` (jf_core/training/parallel.py).

Workers receive paths, not tensors: each reads only its share of the packed examples (every world-th row). Every
`training.checkpoint_every` steps the workers write a sharded checkpoint (torch.distributed.checkpoint) into the
round's `checkpoints/`; when a worker dies, Ray Train restarts the group (`compute.train_max_failures`) and every
worker resumes from the last complete checkpoint, fast-forwarding its data, so the run ends with the weights an
uninterrupted one would have. At the end rank 0 gathers the full state and writes the model directory in the
model's dtype (the same format as one-process training, so evaluation and registration do not change).

A private loopback Ray with token auth by default; a cluster with RAY_ADDRESS or `compute.ray_address`, joined
with token auth (infra/ray_cluster.py). On one machine: `training.strategy: fsdp2`, `compute.train_workers: 2`.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from jacobi_forcing.infra.ray_cluster import loopback_torch_config, ray_session
from jf_core.atomic import write_json_atomic, write_text_atomic
from jf_core.config import Profile
from jf_core.training.trainer import TrainSummary

CHAOS_ENV = "JF_CHAOS_KILL_WORKER"  # test hook: "rank:step:marker" - that worker dies after that step, once
PROGRESS = "progress.json"  # rank 0's last logged row, for the driver (Prefect progress, logs)
SUMMARY = "summary.json"  # rank 0's TrainSummary at the end, for the driver


def _worker_loop(config: dict) -> None:
    """One Ray Train worker: its place in the group, then the round's one training driver."""
    import ray.train
    import ray.train.torch  # get_device; `import ray.train` alone does not load it
    import torch

    from jf_core.round.training import train_round

    profile = Profile.model_validate(config["profile"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(config["threads"])))
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kill = os.environ.get(CHAOS_ENV, "").split(":") if os.environ.get(CHAOS_ENV) else None
    progress = Path(config["checkpoints"]) / PROGRESS
    steps = profile.training.steps

    def on_log(step: int, row: dict) -> None:
        if rank == 0:
            write_json_atomic(progress, {**row, "step": step, "steps": steps})
        if kill and int(kill[0]) == rank and int(kill[1]) == step and not os.path.exists(kill[2]):
            Path(kill[2]).write_text(f"rank {rank} died after step {step}")
            os._exit(1)  # as abruptly as a lost node: no cleanup, no goodbye to the process group

    summary = train_round(
        profile,
        config["model_in"],
        Path(config["packed"]),
        Path(config["checkpoints"]),
        Path(config["out"]),
        device=device,
        rank=rank,
        world=world,
        log_every=1,
        on_log=on_log,
    )
    if rank == 0:  # the launcher's copy of the summary, beside the progress file (both in the shared checkpoints)
        write_text_atomic(Path(config["checkpoints"]) / SUMMARY, summary.model_dump_json())
    ray.train.report({"step": summary.steps, "rank": rank})


def train_distributed(
    profile: Profile,
    paths,
    model_in: str,
    *,
    on_log: Callable[[int, dict], None] | None = None,
    storage: str | Path | None = None,
) -> TrainSummary:
    """Train on `compute.train_workers` Ray Train workers with `training.strategy`; returns rank 0's summary."""
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    compute = profile.compute
    cpus = max(1, int(compute.cpus_per_worker))
    gpus = compute.gpus_per_worker
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    config = {
        "profile": profile.model_dump(mode="json"),
        "model_in": model_in,
        "packed": str(paths.examples.resolve()),
        "checkpoints": str(paths.checkpoints.resolve()),
        "out": str(paths.model.resolve()),
        "threads": cpus,
    }
    watcher = _ProgressWatcher(paths.checkpoints / PROGRESS, on_log)
    num_cpus = max(os.cpu_count() or 1, compute.train_workers * cpus)
    with ray_session(compute.ray_address, num_cpus=num_cpus) as session, watcher:
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config=config,
            # On a loopback Ray every worker is on this machine: its rendezvous stays on 127.0.0.1 too.
            torch_config=loopback_torch_config() if session.loopback else TorchConfig(),
            scaling_config=ScalingConfig(
                num_workers=compute.train_workers, use_gpu=gpus > 0, resources_per_worker=resources
            ),
            run_config=RunConfig(
                name=f"jf-train-{paths.root.name}",
                storage_path=str(Path(storage or paths.root / "ray-train").resolve()),
                failure_config=ray.train.FailureConfig(max_failures=compute.train_max_failures),
            ),
        )
        result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"distributed training ({profile.training.strategy}) failed: {result.error}")
    return TrainSummary.model_validate_json((paths.checkpoints / SUMMARY).read_text())


class _ProgressWatcher:
    """Feeds rank 0's logged rows (its progress file) to `on_log` while the workers train, in the caller's context
    (a Prefect task's run context lives in contextvars, which a new thread would not have)."""

    def __init__(self, path: Path, on_log: Callable[[int, dict], None] | None) -> None:
        self.path, self.on_log = path, on_log
        self.context = contextvars.copy_context()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.seen = -1

    def __enter__(self) -> _ProgressWatcher:
        if self.on_log is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        self._poll()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self._poll()

    def _poll(self) -> None:
        if self.on_log is None or not self.path.is_file():
            return
        try:
            row = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return
        step = int(row.pop("step"))
        row.pop("steps", None)
        if step > self.seen:
            self.seen = step
            self.context.copy().run(self.on_log, step, row)
