from __future__ import annotations

from jacobi_forcing.flows.progressive import round_overrides
from jf_core.config import load_profile


def test_each_round_overrides_its_block_size_and_training_over_the_callers():
    prof = load_profile("tiny")
    given = {"training": {"steps": 7, "lr": 0.5}, "evaluation": {"tune": {"prompts": 4}}}
    first, second = (round_overrides(given, prof, i) for i in (0, 1))
    assert first == {
        "training": {"steps": 7, "lr": 0.5},  # round 0 names no training fields: the caller's stand
        "evaluation": {"tune": {"prompts": 4}},
        "trajectory": {"block_size": 16, "round_id": "round-0"},
    }
    # round 1's own steps and rate win over the caller's; every round gets a profile that validates
    assert second["training"] == {"steps": 2000, "lr": 0.001} and second["trajectory"]["block_size"] == 32
    assert load_profile("tiny", **second).evaluation.tune.prompts == 4
    assert given == {"training": {"steps": 7, "lr": 0.5}, "evaluation": {"tune": {"prompts": 4}}}  # untouched
