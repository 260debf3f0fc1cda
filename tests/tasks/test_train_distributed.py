"""Ray Train with 2 CPU workers (gloo DDP) runs the same loop and writes one model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from jf_core.config import JFTrainConfig
from tasks.train_distributed import train_distributed
from tasks.trajectories import generate_trajectories

pytestmark = pytest.mark.timeout(600)


def test_two_worker_ddp_training(ray_local, profile, tmp_path):
    generate_trajectories(profile, tmp_path / "t", progress=False)
    p = profile.model_copy(update={"training": JFTrainConfig(steps=4, batch_size=2, warmup_steps=1, lr=1e-3)})
    metrics = train_distributed(
        p, tmp_path / "t", p.model.path, tmp_path / "out", num_workers=2, storage=tmp_path / "rt"
    )
    assert metrics["world_size"] == 2 and metrics["step"] == 3.0
    before = load_file(f"{p.model.path}/model.safetensors")
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before), "training should change the weights"
