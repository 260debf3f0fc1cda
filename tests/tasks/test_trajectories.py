"""Trajectory generation on a real local Ray: resumable, idempotent, and whole after an actor dies mid-shard."""

from __future__ import annotations

import pytest

from jacobi_forcing.tasks.trajectories import CHAOS_ENV, generate_trajectories
from jf_core.trajectory.store import TrajectoryStore

pytestmark = pytest.mark.timeout(600)


def shard_rows(out):
    return {k: v["rows"] for k, v in TrajectoryStore(out).manifest()["shards"].items()}


def test_generate_then_rerun_regenerates_nothing(ray_local, profile, tmp_path):
    seen = []
    first = generate_trajectories(profile, tmp_path / "t", progress=False, on_shard=lambda *c: seen.append(c))
    assert first.prompts == 22 and first.shards == 6 and first.shards_generated == 6
    # Progress without a terminal bar, as the flow runs it: every commit counted (a disabled tqdm counts none).
    assert seen == [(i, 6) for i in range(1, 7)]
    assert first.skipped == {"empty": 1, "too_long": 1, "missing_field:prompt": 1}
    ds = TrajectoryStore(tmp_path / "t").dataset()
    assert len(ds) == first.rows == 22 * 3  # 24 new tokens = 3 blocks of 8 (no EOS from a random model this short)
    assert all(r["states"][-1] == r["fixed_point"] for r in ds)
    again = generate_trajectories(profile, tmp_path / "t", progress=False)
    assert again.shards_generated == 0 and again.rows == first.rows


@pytest.mark.faults
def test_actor_death_mid_shard_loses_and_duplicates_nothing(ray_local, profile, tmp_path, monkeypatch):
    calm = generate_trajectories(profile, tmp_path / "calm", progress=False)
    marker = tmp_path / "died"
    monkeypatch.setenv(CHAOS_ENV, str(marker))
    chaos = generate_trajectories(profile, tmp_path / "chaos", progress=False)
    assert marker.exists(), "the chaos hook should have killed one actor"
    assert chaos.shards_generated == calm.shards_generated == 6
    assert shard_rows(tmp_path / "chaos") == shard_rows(tmp_path / "calm")
    files = sorted(p.name for p in (tmp_path / "chaos").iterdir() if p.name.endswith((".parquet", ".tmp")))
    assert files == sorted(f"shard-{k}.parquet" for k in shard_rows(tmp_path / "calm"))
    calm_rows = TrajectoryStore(tmp_path / "calm").read().to_pylist()
    chaos_rows = TrajectoryStore(tmp_path / "chaos").read().to_pylist()
    assert sorted(calm_rows, key=lambda r: (r["prompt_id"], r["block_index"])) == sorted(
        chaos_rows, key=lambda r: (r["prompt_id"], r["block_index"])
    )
