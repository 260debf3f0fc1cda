"""The growth fits behind the curve's budgets (jf_core/evaluation/growth.py): exact on exact data, and intervals
that hold the true crossing about as often as they say."""

from __future__ import annotations

import numpy as np
import pytest

from jf_core.evaluation.growth import fit_growth

TOKENS = [5.7e4, 1.1e5, 1.7e5, 2.3e5, 2.8e5, 3.4e5, 4.0e5, 4.5e5]


def test_exact_data_gives_its_own_coefficients_and_crossings():
    log = fit_growth(TOKENS, [1.0 + 0.3 * np.log10(t / 1e4) for t in TOKENS], "log10")
    assert log.a == pytest.approx(1.0 - 1.2) and log.b == pytest.approx(0.3) and log.r2 == pytest.approx(1.0)
    estimate, low, high = log.tokens_for(2.0)
    assert estimate == pytest.approx(1e4 * 10 ** (1 / 0.3), rel=1e-9) and low == pytest.approx(high, rel=1e-6)
    line = fit_growth(TOKENS, [1.1 + 0.7 * t / 1e6 for t in TOKENS], "linear")
    assert line.b == pytest.approx(0.7) and line.at(1e6) == pytest.approx(1.8)
    assert line.tokens_for(2.0)[0] == pytest.approx(0.9e6 / 0.7)
    falling = fit_growth(TOKENS, [2.0 - 0.1 * t / 1e6 for t in TOKENS], "linear")
    assert falling.tokens_for(2.5) is None  # a fit that never rises never crosses


def test_the_interval_holds_the_true_crossing_about_as_often_as_it_says():
    rng = np.random.default_rng(1)
    truth = 1e4 * 10 ** (1 / 0.3)
    held = 0
    for trial in range(200):
        noisy = [1.0 + 0.3 * np.log10(t / 1e4) + rng.normal(0, 0.02) for t in TOKENS]
        _, low, high = fit_growth(TOKENS, noisy, "log10").tokens_for(2.0, samples=4000, seed=trial)
        held += low <= truth <= high
    assert 0.84 <= held / 200 <= 0.96, held  # 90% asked; 200 trials: about +-4% by chance


def test_too_few_points_or_an_unknown_form_are_refused_by_name():
    with pytest.raises(ValueError, match="3 or more"):
        fit_growth([1e5, 2e5], [1.1, 1.2], "log10")
    with pytest.raises(ValueError, match="form must be"):
        fit_growth(TOKENS, [1.0] * 8, "power")


def test_the_curves_fits_name_the_budget_for_each_target_beside_what_a_probe_measured():
    """`--from-json FILE` prints each probed curve fitted in both forms: the tokens to TPF 1.5 and 2.0 with an
    interval (and 2.5), beside the first probe that measured them (the fits are jf_core/evaluation/growth.py's)."""
    from jf_core.evaluation.growth import curve_fits, fits_table
    from jf_core.training.history import TpfProbe

    history = [{"step": float(s - 1), "probe_tpf_n16": 1.0 + 0.5 * s / 8} for s in range(1, 9)]  # 1 per 8e3 tokens
    fits = curve_fits([{"variant": "v", "train_tokens": 8000, "history": history}])
    assert [(f.probe, f.fit.form) for f in fits] == [(TpfProbe(16), "log10"), (TpfProbe(16), "linear")]
    line = fits[1]
    assert line.fit.r2 > 0.999 and abs(line.fit.b - 62.5) < 1e-6  # 0.5 TPF per 8e3 tokens, per 1e6
    assert line.measured[1.5] == 8000 and line.measured[2.0] is None
    estimate, low, high = line.budgets[2.0]
    assert abs(estimate - 16000) < 1e-3 and low <= estimate <= high
    assert abs(line.budgets[2.5][0] - 24000) < 1e-3 and line.measured[2.5] is None  # the scale issue's second goal
    assert line.metrics()["fit.linear.n16.tokens_tpf_2.0"] == estimate  # as MLflow gets it
    assert "| v | n16 | linear |" in fits_table(fits)
    assert curve_fits([{"variant": "v", "train_tokens": 8000, "history": history[:2]}]) == []  # 2 probes: no fit


def test_tpf_against_tokens_puts_each_probe_at_its_training_tokens():
    """The curve's x axis: a probe after k steps of a run of S steps and T packed tokens sits at k*T/S tokens."""
    from jf_core.evaluation.plots import tpf_against_tokens

    history = [{"step": 0.0, "loss": 3.0}, {"step": 1.0, "probe_tpf_n16": 1.1}, {"step": 3.0, "probe_tpf_n16": 1.4}]
    fig = tpf_against_tokens([{"variant": "both", "train_tokens": 4000, "history": history}])
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [2000.0, 4000.0] and list(line.get_ydata()) == [1.1, 1.4]
    assert fig.axes[0].get_xscale() == "log"
    assert tpf_against_tokens([{"variant": "x", "train_tokens": 10, "history": history[:1]}]) is None
