"""Fixtures of the tasks tests: one local Ray per module, and a tiny-model profile over a JSONL of prompts."""

from __future__ import annotations

import json

import pytest
import ray

from jf_core.config import ComputeConfig, ModelConfig, Profile, TrajectoryConfig
from jf_core.toy.model import ToyModelConfig, build_model
from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prompts import PromptSourceConfig


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
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
