"""What a variant and a seed are (jf_core/experiments/variants.py), for the experiment and the ablation alike."""

from __future__ import annotations

import pytest

from jf_core.experiments.variants import run_overrides, sectioned, seeded, variant_profile


def test_a_variant_is_training_fields_or_sections():
    assert sectioned({"lr": 1e-3}) == {"training": {"lr": 1e-3}}
    assert sectioned({"draft_lora": {"rank": 8}}) == {"training": {"draft_lora": {"rank": 8}}}
    both = {"training": {"lr": 1e-3}, "trajectory": {"kind": "synthetic"}}
    assert sectioned(both) == both and sectioned({}) == {"training": {}}


def test_each_variant_runs_once_per_seed_and_starts_from_the_same_seeds_run():
    variants = {"a": {"training": {"lr": 1e-3}}, "b": {"training": {"steps": 5}, "from": "a"}}
    assert seeded(variants, None) == variants
    runs = seeded(variants, [0, 7])
    assert list(runs) == ["a (seed 0)", "b (seed 0)", "a (seed 7)", "b (seed 7)"]
    assert runs["a (seed 7)"] == {"training": {"lr": 1e-3, "seed": 7}}
    assert runs["b (seed 7)"] == {"training": {"steps": 5, "seed": 7}, "from": "a (seed 7)"}
    assert run_overrides({"training": {"steps": 3}}, {"training": {"lr": 1.0}}, None) == {
        "training": {"steps": 3, "lr": 1.0}
    }


def test_a_variant_outside_its_sections_is_refused_by_name(profile):
    with pytest.raises(ValueError, match=r"overrides .* only, not \[.evaluation.\]"):
        variant_profile(profile, {"evaluation": {"batch_size": 2}})
    assert variant_profile(profile, {"training": {"seed": 5}}).training.seed == 5
