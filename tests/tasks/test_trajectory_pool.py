"""Where the trajectory shards are made: a Ray actor pool, or one fresh process where the pool would be one CPU actor
(`compute.trajectory_pool`), the store the same either way."""

from __future__ import annotations

import pytest

from jacobi_forcing.tasks import trajectories
from jacobi_forcing.tasks.trajectories import generate_trajectories, pool_kind
from jf_core.config import ComputeConfig
from jf_core.trajectory.store import TrajectoryStore

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize(
    ("compute", "shards", "cpus", "ray_address", "kind"),
    [
        ({}, 6, 1, None, "in_process"),  # CPUs for one actor (JF_CPUS=1)
        ({}, 6, 2, None, "ray"),  # two actors, two CPUs
        ({}, 1, 2, None, "in_process"),  # one shard: one actor would do it
        ({"workers": 1}, 6, 2, None, "in_process"),
        ({"cpus_per_worker": 0.5}, 6, 1, None, "ray"),  # two half-CPU actors
        ({}, 6, 1, "127.0.0.1:6379", "ray"),  # a cluster is asked for (RAY_ADDRESS)
        ({"ray_address": "127.0.0.1:6379"}, 6, 1, None, "ray"),
        ({"gpus_per_worker": 1}, 6, 1, None, "ray"),  # GPU actors are Ray's to place
        ({"trajectory_pool": "ray"}, 1, 1, None, "ray"),  # chosen, not resolved
        ({"trajectory_pool": "in_process"}, 6, 2, None, "in_process"),
    ],
)
def test_auto_makes_shards_in_process_only_where_the_pool_would_be_one_cpu_actor(
    monkeypatch, compute, shards, cpus, ray_address, kind
):
    monkeypatch.setattr("jf_core.threads.cpu_budget", lambda env=None: cpus)  # what JF_CPUS or the machine allows
    if ray_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    assert pool_kind(ComputeConfig(**compute), shards) == kind


def test_the_in_process_store_is_the_ray_pools_and_starts_no_ray(profile, tmp_path, monkeypatch):
    """The same shards under the same keys, the same records, progress counted alike; no Ray pool is started."""
    by_ray = profile.model_copy(update={"compute": profile.compute.model_copy(update={"trajectory_pool": "ray"})})
    ray_result = generate_trajectories(by_ray, tmp_path / "ray", progress=False)

    def no_pool(*_args, **_kwargs):
        raise AssertionError("the in-process collector started the Ray actor pool")

    monkeypatch.setattr(trajectories, "_run_pool", no_pool)
    monkeypatch.setenv("JF_CPUS", "1")
    seen = []
    here = generate_trajectories(profile, tmp_path / "here", progress=False, on_shard=lambda *c: seen.append(c))
    assert seen == [(i, 6) for i in range(1, 7)]
    assert (here.prompts, here.shards, here.shards_generated, here.rows, here.skipped) == (
        ray_result.prompts, ray_result.shards, ray_result.shards_generated, ray_result.rows, ray_result.skipped,
    )  # fmt: skip
    manifests = [TrajectoryStore(tmp_path / d).manifest()["shards"] for d in ("ray", "here")]
    assert {k: v["rows"] for k, v in manifests[0].items()} == {k: v["rows"] for k, v in manifests[1].items()}
    rows = [TrajectoryStore(tmp_path / d).read().to_pylist() for d in ("ray", "here")]
    order = lambda r: (r["prompt_id"], r["block_index"])  # noqa: E731
    assert sorted(rows[0], key=order) == sorted(rows[1], key=order)
    assert generate_trajectories(profile, tmp_path / "here", progress=False).shards_generated == 0  # resumed
