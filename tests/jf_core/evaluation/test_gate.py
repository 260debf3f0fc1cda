"""The promotion gate's checks, each with its reason: accuracy against the input and the lineage's base, TPF
against the champion's only where measured alike, speed against AR and against the best untrained decoding, and
outputs that may not turn degenerate."""

from __future__ import annotations

from dataclasses import replace

from jf_core.config import GateConfig
from jf_core.evaluation.gate import Figures, decide
from jf_core.evaluation.speed import ratio_interval

CLEAN = {"repetition": 0.05, "mean_length": 74.0, "truncated": 0.0}
CFG = GateConfig()


def fig(
    accuracy=1.0,
    tpf=None,
    headline=3.0,
    decode="d16",
    key="e1",
    output=None,
    speedup=2.0,
    untrained=1.5,
    spread=0.01,
    low=None,
) -> Figures:
    return Figures(
        accuracy,
        tpf or {"16": 3.0},
        headline,
        decode,
        key,
        dict(output or CLEAN),
        speedup,
        untrained,
        "base_tuned",
        spread,
        low,
    )


def gate(candidate, *, input_model=None, base=None, champion=None, cfg=CFG):
    return decide(candidate, input_model=input_model or fig(), base_model=base or fig(), champion=champion, cfg=cfg)


def check(decision, name):
    return next(c for c in decision.checks if c.name == name)


def test_first_champion_needs_accuracy_and_clean_outputs_only():
    d = gate(fig(0.98))
    assert d.passed and "no champion" in check(d, "tpf_vs_champion").reason
    assert [c.name for c in d.checks] == [
        "accuracy_vs_input",
        "accuracy_vs_base",
        "tpf_vs_champion",
        "speed_vs_ar",
        "speed_vs_untrained",
        "repetition",
        "length",
        "truncated",
    ]
    assert d.reasons == [c.reason for c in d.checks]


def test_drift_within_tolerance_each_round_is_caught_against_the_lineage_base():
    """(a) 0.02 below the input model (allowed: 0.03) but 0.07 below the chain's original base (allowed: 0.05)."""
    d = gate(fig(0.93), input_model=fig(0.95), base=fig(1.0))
    assert check(d, "accuracy_vs_input").passed
    base = check(d, "accuracy_vs_base")
    assert not base.passed and not d.passed
    assert base.reason == "accuracy dropped 0.0700 (> 0.05) from the lineage base model's 1.0000"


def test_a_higher_tpf_at_a_larger_block_size_only_proves_nothing():
    """(b) The champion was measured at n=16; a model measured at n=32 only (another decode config) is refused,
    and one that is higher at n=32 but lower at n=16 is refused for n=16."""
    champion = fig(tpf={"16": 3.0}, headline=3.0, decode="d16")
    only_larger = gate(fig(tpf={"32": 5.0}, headline=5.0, decode="d32"), champion=champion)
    tpf = check(only_larger, "tpf_vs_champion")
    assert not only_larger.passed and not tpf.passed
    assert tpf.reason.startswith("no TPF at a block size or decode config the champion was measured at")
    lower_at_16 = gate(fig(tpf={"16": 2.9, "32": 5.0}, headline=5.0, decode="d32"), champion=champion)
    tpf = check(lower_at_16, "tpf_vs_champion")
    assert not tpf.passed and "n=16 2.900 vs 3.000" in tpf.reason and tpf.value < 0
    better = gate(fig(tpf={"16": 3.1, "32": 5.0}, headline=5.0, decode="d32"), champion=champion)
    assert better.passed


def test_the_headline_is_compared_only_between_identical_decode_configs():
    champion = fig(tpf={"16": 3.0}, headline=6.0, decode="tuned")
    same = gate(fig(tpf={"16": 3.0}, headline=5.9, decode="tuned"), champion=champion)
    assert not same.passed and "headline config 5.900 vs 6.000" in check(same, "tpf_vs_champion").reason
    other = gate(fig(tpf={"16": 3.0}, headline=5.9, decode="other"), champion=champion)
    assert other.passed and "headline" not in check(other, "tpf_vs_champion").reason


def test_figures_from_another_evaluation_are_not_compared():
    d = gate(fig(tpf={"16": 9.0}), champion=fig(key="e2"))
    assert not d.passed and "another evaluation" in check(d, "tpf_vs_champion").reason


def test_a_model_that_repeats_itself_is_refused_even_when_accuracy_and_tpf_hold():
    """(c) at the level of figures; tests/tasks/test_gate_registry.py measures a real repeating model."""
    looping = fig(output={"repetition": 0.22, "mean_length": 80.0, "truncated": 0.0})
    d = gate(looping, champion=fig())
    assert [c.name for c in d.checks if not c.passed] == ["repetition"]
    assert check(d, "repetition").reason == "repeated n-grams 0.220 vs the input model's 0.050 (beyond +0.05)"


def test_padding_to_the_limit_is_refused_by_length_and_truncation():
    padded = fig(output={"repetition": 0.05, "mean_length": 160.0, "truncated": 0.5})
    d = gate(padded)
    assert {c.name for c in d.checks if not c.passed} == {"length", "truncated"}
    shorter = fig(output={**CLEAN, "mean_length": 74.0 * 0.8})  # a 20% change is within the default 25%
    assert gate(shorter).passed


def test_unmeasured_output_figures_fail_instead_of_passing_blind():
    d = gate(replace(fig(), output={}))
    assert not d.passed and "were not measured" in check(d, "degeneracy").reason


def test_tpf_check_can_be_disabled_and_negative_tolerance_demands_improvement():
    off = GateConfig(tpf_not_below_champion=False)
    d = gate(fig(tpf={"16": 2.0}), champion=fig(), cfg=off)
    assert d.passed and "tpf_vs_champion" not in {c.name for c in d.checks}
    strict = GateConfig(max_accuracy_drop=-1.0)
    assert not gate(fig(), cfg=strict).passed


def test_a_model_whose_decoding_is_slower_than_ar_is_refused_whatever_its_tpf():
    """A real model's window costs more than a step on a CPU: TPF 1.3 at 0.63x AR (issue 51's first try) must not
    become the champion. An AR-dispatched model measures about 1.0 and passes; an unmeasured speed fails."""
    slow = gate(fig(tpf={"16": 1.3}, headline=1.3, speedup=0.63))
    speed = check(slow, "speed_vs_ar")
    assert not slow.passed and not speed.passed and speed.value == 0.63
    assert speed.reason.startswith("decoding at 0.63x our AR is slower than AR (floor 0.9)")
    assert [c.name for c in slow.checks if not c.passed] == ["speed_vs_ar"]
    assert gate(fig(headline=1.0, speedup=0.97)).passed  # AR dispatched: within the spread
    for unmeasured in (None, float("nan")):
        d = gate(fig(speedup=unmeasured))
        assert not d.passed and "was not measured" in check(d, "speed_vs_ar").reason
    off = gate(fig(speedup=0.5), cfg=GateConfig(min_speedup_vs_ar=None))
    assert off.passed and "speed_vs_ar" not in {c.name for c in off.checks}


def test_a_model_no_faster_than_the_best_untrained_decoding_beyond_the_spread_is_refused():
    """Issue 69's rule: training a user could skip for the same speed is not promoted. The bar is 1 + the timing's
    spread: the configured floor, or the run's AR-against-AR control where that was wider."""
    beaten = gate(fig(speedup=1.19, untrained=0.90))  # the SmolLM2 user round: 1.19x AR, the untrained base 1.32x
    anchor = check(beaten, "speed_vs_untrained")
    assert not beaten.passed and not anchor.passed and anchor.value == 0.90
    assert anchor.reason.startswith("decoding at 0.90x the best untrained decoding (base_tuned) is not faster")
    assert [c.name for c in beaten.checks if not c.passed] == ["speed_vs_untrained"]
    assert not gate(fig(untrained=1.03)).passed  # at the floor (0.03): within the spread, refused
    assert gate(fig(untrained=1.04)).passed  # beyond it
    wide = check(gate(fig(untrained=1.04, spread=0.06)), "speed_vs_untrained")  # the control saw 6% between ARs
    assert not wide.passed and "spread 0.060" in wide.reason
    assert gate(fig(untrained=1.07, spread=0.06)).passed
    for unmeasured in (None, float("nan")):
        d = gate(fig(untrained=unmeasured))
        assert not d.passed and "was not measured beside this model" in check(d, "speed_vs_untrained").reason
    off = gate(fig(untrained=None), cfg=GateConfig(untrained_margin=None))
    assert off.passed and "speed_vs_untrained" not in {c.name for c in off.checks}


def test_a_speedup_that_resampled_prompts_take_below_one_is_refused():
    """Beyond the timer's spread on these prompts is not enough where the prompts drawn decide it: the lower end of
    the 95% interval over resampled prompts must clear 1 too (where the rows kept their batches)."""
    drawn = check(gate(fig(untrained=1.10, low=0.98)), "speed_vs_untrained")
    assert not drawn.passed and drawn.value == 1.10
    assert "as low as 0.98x (95%)" in drawn.reason
    held = check(gate(fig(untrained=1.16, low=1.11)), "speed_vs_untrained")
    assert held.passed and "at least 1.11x over resampled prompts" in held.reason
    assert gate(fig(untrained=1.10)).passed  # no interval known (figures kept before rows kept their batches)
    assert not gate(fig(untrained=1.02, low=1.01)).passed  # the spread's rule still holds on its own


def test_the_gate_reads_the_interval_from_an_evaluation():
    """`Figures.of` takes the interval's lower end from the rows' batches (speed.py `ratio_interval`), and knows
    none where the rows kept no batches."""
    from tests.reports import evaluation

    ev = evaluation({16: 2.0}, {"ar": 10.0, "jacobi_n16": 12.0}, tuned={"tpf": 2.5, "tps": 20.0, "config": {}},
                    untrained={"tuned": (1.8, 16.0)})  # fmt: skip
    assert Figures.of(ev, "e1").untrained_low is None
    timed = {"tuned": [1.0, 0.8, 1.2, 0.9], "base_tuned": [1.3, 1.0, 1.3, 1.2]}
    for name, seconds in timed.items():
        ev.methods[name] = replace(ev.methods[name], batch_seconds=seconds, batch_tokens=[10] * 4)
    low = Figures.of(ev, "e1").untrained_low
    assert low == ratio_interval(ev.methods["tuned"], ev.methods["base_tuned"])[0] and 1.0 < low < 1.3


def test_figures_round_trip_through_a_version_tag():
    f = fig(tpf={"16": 3.25, "32": 4.5}, output={"repetition": 0.1, "mean_length": 9.5, "truncated": 0.25})
    assert Figures.from_json(f.to_json()) == f
