"""Round layout: rounds that differ in training alone share one trajectory store; anything shaping trajectories
gives a store of its own."""

from __future__ import annotations

from jf_core.config import JFTrainConfig
from tasks.stages import round_paths


def test_rounds_share_trajectories_exactly_when_trajectories_would_be_equal(profile, tmp_path):
    p = profile.model_copy(update={"storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path)})})
    a = round_paths(p, p.model.path)
    b = round_paths(p.model_copy(update={"training": JFTrainConfig(schedule="random")}), p.model.path)
    c = round_paths(p.model_copy(update={"trajectory": p.trajectory.model_copy(update={"seed": 1})}), p.model.path)
    assert a.root != b.root and a.trajectories.is_symlink() and b.trajectories.is_symlink()
    assert a.trajectories.resolve() == b.trajectories.resolve()  # training alone differs: one store
    assert c.trajectories.resolve() != a.trajectories.resolve()  # another seed: other trajectories
    (a.trajectories / "manifest.json").write_text("{}")
    assert (b.trajectories / "manifest.json").is_file()
    assert round_paths(p, p.model.path).trajectories.resolve() == a.trajectories.resolve()  # stable on re-entry
