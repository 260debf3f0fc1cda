"""The dispatch: the artifact's prior until this server has measured both methods at a batch size, then the faster
one by a margin; probes keep both measured; the running mean TPF still sends Jacobi that does not pay to AR."""

from __future__ import annotations

import pytest

from jf_core.serving.dispatch import Dispatch, bucket


def test_batch_sizes_share_power_of_two_buckets():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64]


def run(dispatch: Dispatch, batch_size: int, rates: dict[str, float], batches: int, **prior) -> list[str]:
    """`batches` batches of `batch_size`, each method delivering its tokens/s from `rates`."""
    methods = []
    for _ in range(batches):
        method = dispatch.choose(batch_size, **prior)
        dispatch.observe(method, batch_size, tokens=int(rates[method]), seconds=1.0)
        methods.append(method)
    return methods


def test_a_too_conservative_crossover_gives_way_to_measured_jacobi():
    prior = {"ar_above_batch": 8, "break_even_tpf": None}
    methods = run(Dispatch(), 16, {"jacobi": 300, "ar": 100}, 20, **prior)
    assert methods[:3] == ["ar", "jacobi", "jacobi"]  # the prior, its probe, then what the server measured
    assert methods.count("ar") == 3 and methods[9] == "ar" and methods[17] == "ar"  # the probes keep AR measured


def test_measured_ar_wins_over_a_too_optimistic_crossover_and_other_buckets_keep_the_prior():
    d = Dispatch()
    prior = {"ar_above_batch": None, "break_even_tpf": None}
    methods = run(d, 32, {"jacobi": 100, "ar": 250}, 10, **prior)
    assert methods[:3] == ["jacobi", "ar", "ar"] and methods[9] == "jacobi"
    assert d.choose(1, **prior) == "jacobi"  # batch 1 is another bucket: nothing measured there yet


def test_a_margin_keeps_noise_from_overriding_the_prior():
    methods = run(Dispatch(margin=0.1), 16, {"jacobi": 105, "ar": 100}, 9, ar_above_batch=8, break_even_tpf=None)
    assert methods.count("jacobi") == 1  # only the probe


def test_a_change_in_speed_is_followed():
    d = Dispatch()
    prior = {"ar_above_batch": None, "break_even_tpf": None}
    run(d, 4, {"jacobi": 300, "ar": 100}, 9, **prior)
    later = run(d, 4, {"jacobi": 50, "ar": 100}, 12, **prior)  # e.g. prompts the model accepts little of
    assert later[-3:] == ["ar"] * 3


def test_running_tpf_below_break_even_sends_jacobi_to_ar():
    d = Dispatch()
    prior = {"ar_above_batch": None, "break_even_tpf": 1.5}
    assert d.choose(1, **prior) == "jacobi"
    d.observe("jacobi", 1, tokens=10, seconds=1.0, tpf=1.1)
    d.observe("jacobi", 1, tokens=10, seconds=1.0, tpf=1.2)
    assert d.prior(1, **prior) == "ar"
    d.observe("jacobi", 1, tokens=10, seconds=1.0, tpf=4.0)
    assert d.prior(1, **prior) == "jacobi"  # mean 2.1


@pytest.mark.parametrize(("tokens", "seconds"), [(0, 1.0), (5, 0.0)])
def test_empty_batches_measure_nothing(tokens, seconds):
    d = Dispatch()
    d.observe("ar", 2, tokens=tokens, seconds=seconds)
    assert d.rates == {} and d.summary() == {}
