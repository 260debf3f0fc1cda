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


def test_a_round_takes_the_earlier_rounds_summaries_as_its_history():
    """jf-progressive passes each round the summaries of the rounds before it; over the API they arrive as JSON and
    the flow's parameter validation gives them back as `RoundSummary`s, which the TPF-per-round figure reads."""
    from jacobi_forcing.flows.round import jf_round
    from jf_core.round.figures import tpf_per_round
    from jf_core.round.report import RoundSummary
    from tests.reports import evaluation, round_report

    tps = {"ar": 500.0, "jacobi_n16": 900.0}
    summary = round_report(evaluation({16: 3.0}, tps), evaluation({16: 1.3}, tps)).summary()
    params = jf_round.validate_parameters({"profile": "tiny", "history": [summary.model_dump(mode="json")]})
    assert params["history"] == [summary] and isinstance(params["history"][0], RoundSummary)
    assert tpf_per_round([*params["history"], summary]).axes[0].get_title() == "Vanilla Jacobi TPF per round"


def test_a_built_profile_is_taken_as_it_is_and_named_by_its_name():
    """`jf run` builds the profile once and hands it to the flow: the flow's parameter validation keeps it (no second
    build), over the API it comes back from JSON as the same profile, and overrides still apply to it."""
    from jacobi_forcing.flows.round import jf_round, load, profile_label, run_key

    prof = load_profile("tiny", training={"steps": 5})
    params = jf_round.validate_parameters({"profile": prof})
    assert params["profile"] is prof and load(prof, None) is prof
    over_api = jf_round.validate_parameters({"profile": prof.model_dump(mode="json")})["profile"]
    assert over_api == prof and over_api.training.steps == 5
    assert load(prof, {"training": {"lr": 0.5}}).training.lr == 0.5 and prof.training.lr != 0.5
    assert profile_label(prof) == profile_label(prof.model_dump(mode="json")) == profile_label("tiny") == "tiny"
    assert run_key({"profile": prof}) == run_key({"profile": over_api}) != run_key({"profile": "tiny"})
