from __future__ import annotations

import pytest

from jf_core.config import available_profiles, load_profile


def test_shipped_profiles_validate():
    assert {"tiny", "qwen2.5-coder-7b"} <= set(available_profiles())
    tiny = load_profile("tiny")
    assert tiny.model.path == "embedded" and tiny.prompts.source == "embedded"
    real = load_profile("qwen2.5-coder-7b")
    assert real.model.dtype == "bfloat16" and real.compute.gpus_per_worker == 1 and real.prompts.chat_template


def test_overrides_merge_and_ignore_none():
    p = load_profile("tiny", trajectory={"block_size": 32, "seed": None}, compute={"workers": 1})
    assert p.trajectory.block_size == 32 and p.trajectory.seed == 0 and p.compute.workers == 1


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        load_profile("nope")
    with pytest.raises(ValueError, match="block_size"):
        load_profile("tiny", trajectory={"block_size": 0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrajectory:\n  blok_size: 3\n")
    with pytest.raises(ValueError, match="blok_size"):
        load_profile(str(bad))


def test_real_profile_keeps_its_gpu_settings_and_rounds():
    real = load_profile("qwen2.5-coder-7b")
    assert [r.block_size for r in real.rounds] == [32, 64] and real.model_name == "jf-qwen2.5-coder-7b"
    assert real.training.max_length >= 8192 and real.model.device == "cuda"
    assert real.evaluation.benchmark == "humaneval"
