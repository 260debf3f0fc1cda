"""Trajectory generation on a real local Ray: resumable, idempotent, and whole after an actor dies mid-shard."""

from __future__ import annotations

import json

import pytest
import ray

from jf_core.config import ComputeConfig, ModelConfig, Profile, TrajectoryConfig
from jf_core.toy.model import ToyModelConfig, build_model
from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prompts import PromptSourceConfig
from jf_core.trajectory.store import TrajectoryStore
from tasks.trajectories import CHAOS_ENV, generate_trajectories

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    root = tmp_path_factory.mktemp("traj")
    tok = build_tokenizer()
    model = build_model(
        ToyModelConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64),
        len(tok),
        tok.pad_token_id,
        tok.eos_token_id,
        0,
    )
    model.config.max_position_embeddings = 64
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rows = [{"id": e.uid, "prompt": e.prompt} for e in make_split("train", 22)]
    rows += [{"id": "empty", "prompt": "   "}, {"id": "huge", "prompt": "a=1; " * 40}, {"id": "nofield", "text": "x"}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Profile(
        name="test",
        model=ModelConfig(path=str(root / "model"), dtype="float32"),
        prompts=PromptSourceConfig(source=str(root / "prompts.jsonl"), id_field="id"),
        trajectory=TrajectoryConfig(block_size=8, max_new_tokens=24, batch_size=4, shard_size=4),
        compute=ComputeConfig(workers=2),
    )


def shard_rows(out):
    return {k: v["rows"] for k, v in TrajectoryStore(out).manifest()["shards"].items()}


def test_generate_then_rerun_regenerates_nothing(ray_local, profile, tmp_path):
    first = generate_trajectories(profile, tmp_path / "t", progress=False)
    assert first.prompts == 22 and first.shards == 6 and first.shards_generated == 6
    assert first.skipped == {"empty": 1, "too_long": 1, "missing_field:prompt": 1}
    ds = TrajectoryStore(tmp_path / "t").dataset()
    assert len(ds) == first.rows == 22 * 3  # 24 new tokens = 3 blocks of 8 (no EOS from a random model this short)
    assert all(r["states"][-1] == r["fixed_point"] for r in ds)
    again = generate_trajectories(profile, tmp_path / "t", progress=False)
    assert again.shards_generated == 0 and again.rows == first.rows


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
