"""Trajectory generation over a Ray actor pool, or in one fresh process where a pool would be one CPU actor.

One actor per GPU (`gpus_per_worker=1`) or per CPU slot loads the model once and takes prompt shards as they come.
Where that pool would be a single CPU actor on a private Ray (`compute.trajectory_pool: auto`; `pool_kind`), the
shards are made by `jf_core.round.collection.collect_in_process` in a fresh process instead: the same shards, keys
and manifest, without a Ray started for one worker.
A shard's key hashes (model hash, the shard's prompts, block size, seed, generation settings;
jf_core/round/collection.py, the plan the in-process collector shares), and its file is named by the key and
written atomically, so an actor that dies mid-shard (Ray restarts it and retries the call), a retried call, or a
re-run of the whole job can never add a second copy of a shard or lose one; a re-run skips shards the manifest
lists with an unchanged hash. Only this driver writes the manifest.

A private loopback-only Ray with token auth by default; a cluster via `compute.ray_address` or RAY_ADDRESS, joined
with token auth (infra/ray_cluster.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from jacobi_forcing.infra.ray_cluster import ray_session
from jf_core.config import ComputeConfig, Profile
from jf_core.round.collection import collect_in_process, plan_shards
from jf_core.round.fresh import run_fresh
from jf_core.round.results import TrajectoriesResult
from jf_core.trajectory.collect import CollectConfig
from jf_core.trajectory.prompts import PromptItem
from jf_core.trajectory.store import ShardInfo, TrajectoryStore

log = logging.getLogger("jf.stages")

CHAOS_ENV = "JF_CHAOS_DIE_ONCE"  # test hook: path of a marker file; the first shard call that creates it dies


class TrajectoryWorker:
    """Body of the Ray actor (wrapped with ray.remote in `_pool`); importable and testable without Ray."""

    def __init__(
        self,
        model_path: str,
        model_kwargs: dict,
        cfg: CollectConfig,
        out: str,
        model_hash: str,
        threads: int,
        chaos_marker: str | None = None,
    ) -> None:
        import torch

        from jf_core.models import load_model

        torch.set_num_threads(max(1, threads))
        self.model, self.tokenizer = load_model(model_path, **model_kwargs)
        self.cfg, self.out, self.model_hash, self.model_path = cfg, Path(out), model_hash, model_path
        self.chaos_marker = chaos_marker

    def ready(self) -> bool:
        return True

    def run_shard(self, key: str, prompts: list[PromptItem]) -> dict:
        from jf_core.round.collection import make_shard

        def chaos() -> None:
            if self.chaos_marker is not None and not os.path.exists(self.chaos_marker):
                # Die as badly as possible: mid-write, leaving a partial temporary file behind.
                Path(self.chaos_marker).write_text(key)
                (self.out / f".shard-{key}.parquet.partial.tmp").write_bytes(b"PAR1 half a shard")
                os._exit(1)

        info = make_shard(self.model, self.tokenizer, self.cfg, self.out, key, prompts,
                          model_hash=self.model_hash, model_path=self.model_path, before_write=chaos)  # fmt: skip
        return asdict(info)


def generate_trajectories(
    profile: Profile,
    out: str | Path,
    *,
    progress: bool = True,
    on_shard: Callable[[int, int], None] | None = None,
) -> TrajectoriesResult:
    """`on_shard(done, total)` is called as shards are committed (Prefect progress artifacts use it). The shards
    are jf_core/round/collection.py's plan, which the in-process collector shares."""
    from jacobi_forcing.tasks.model_package import resolve_model

    started = time.perf_counter()
    model_path = resolve_model(profile.model.path, profile)
    plan = plan_shards(profile, model_path, out)
    generated_tokens, pool_seconds = 0, 0.0
    if plan.todo and pool_kind(profile.compute, len(plan.todo)) == "in_process":
        log.info("trajectories: %d shards in one fresh process (compute.trajectory_pool)", len(plan.todo))
        say = (lambda line: print(line, flush=True)) if progress else None
        result = run_fresh(collect_in_process, profile, str(out), model_path=model_path,
                           threads=int(profile.compute.cpus_per_worker),
                           callbacks={"on_shard": on_shard, "say": say})  # fmt: skip
        return result.model_copy(update={"seconds": time.perf_counter() - started})  # end to end, as the pool's
    if plan.todo:
        generated_tokens, pool_seconds = _run_pool(
            profile,
            model_path,
            plan.model_hash,
            plan.cfg,
            plan.store,
            plan.todo,
            progress,
            on_shard=on_shard,
            already=len(plan.keyed) - len(plan.todo),
        )
    return plan.result(generated_tokens, time.perf_counter() - started, pool_seconds)


def pool_kind(compute: ComputeConfig, shards: int) -> str:
    """`compute.trajectory_pool`, with `auto` resolved: `in_process` where the Ray pool would be one CPU actor on a
    private Ray (one shard to make, one worker, or CPUs for one: `jf_core.threads.cpu_budget`, which reads JF_CPUS);
    `ray` for a cluster (`compute.ray_address`, RAY_ADDRESS, a Ray this process has joined), GPU actors, or more
    than one actor."""
    if compute.trajectory_pool != "auto":
        return compute.trajectory_pool
    joined = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # a Ray this process already runs in
    if joined or compute.ray_address or os.environ.get("RAY_ADDRESS") or compute.gpus_per_worker > 0:
        return "ray"
    from jf_core.threads import cpu_budget

    actors = min(compute.workers, shards, int(cpu_budget() // compute.cpus_per_worker))
    return "in_process" if actors <= 1 else "ray"


def _run_pool(
    profile: Profile,
    model_path: str,
    model_hash: str,
    cfg: CollectConfig,
    store: TrajectoryStore,
    todo: list,
    progress: bool,
    *,
    on_shard: Callable[[int, int], None] | None = None,
    already: int = 0,
) -> tuple[int, float]:
    import ray
    from ray.util.actor_pool import ActorPool

    compute = profile.compute
    cpus = max(os.cpu_count() or 1, int(compute.workers * compute.cpus_per_worker))
    with ray_session(compute.ray_address, num_cpus=cpus):
        actor_cls = ray.remote(TrajectoryWorker).options(
            num_cpus=compute.cpus_per_worker,
            num_gpus=compute.gpus_per_worker,
            max_restarts=compute.max_restarts,
            max_task_retries=compute.max_task_retries,
        )
        model_kwargs = {**profile.model.decode_kwargs(), "device": profile.worker_device()}
        workers = [
            actor_cls.remote(
                model_path,
                model_kwargs,
                cfg,
                str(store.root),
                model_hash,
                int(compute.cpus_per_worker),
                os.environ.get(CHAOS_ENV),
            )
            for _ in range(min(compute.workers, len(todo)))
        ]
        ray.get([w.ready.remote() for w in workers])  # model loads are start-up, not generation time
        pool = ActorPool(workers)
        payloads = list(todo)  # (key, the shard's PromptItems)
        tokens, t0 = 0, time.perf_counter()
        bar = tqdm(
            total=len(payloads), desc="trajectory shards", unit="shard", disable=not progress, dynamic_ncols=True
        )
        # Counted here, not by bar.n: a disabled tqdm (progress=False, as the flow runs it) counts nothing.
        shards = pool.map_unordered(lambda actor, payload: actor.run_shard.remote(*payload), payloads)
        for committed, info in enumerate(shards, start=1):
            store.commit(ShardInfo(**info))
            tokens += info["new_tokens"]
            bar.update(1)
            if on_shard is not None:
                on_shard(already + committed, already + len(payloads))
            bar.set_postfix(tokens_per_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        bar.close()
        for leftover in store.root.glob(".shard-*.tmp"):
            leftover.unlink()  # partial files of calls that died; their shards were rewritten under the real name
        return tokens, time.perf_counter() - t0
