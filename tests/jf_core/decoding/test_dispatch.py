"""The dispatch: the artifact's prior until this server has measured both methods at a batch size, then the faster
one by a margin; probes keep both measured; the running mean TPF still sends Jacobi that does not pay to AR."""

from __future__ import annotations

import pytest

from jf_core.decoding.dispatch import Dispatch, bucket
from jf_core.model_dir import Crossover, ServingPrior


def test_batch_sizes_share_power_of_two_buckets():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64]


def run(dispatch: Dispatch, batch_size: int, rates: dict, batches: int, **prior) -> list[str]:
    """`batches` batches of `batch_size`, each method delivering its tokens/s from `rates` (a number, or a list
    cycled through: noisy batches)."""
    methods, seen = [], {"jacobi": 0, "ar": 0}
    for _ in range(batches):
        method = dispatch.choose(batch_size, **prior)
        rate = rates[method][seen[method] % len(rates[method])] if isinstance(rates[method], list) else rates[method]
        seen[method] += 1
        dispatch.observe(method, batch_size, tokens=int(rate), seconds=1.0)
        methods.append(method)
    return methods


def test_a_too_conservative_crossover_gives_way_to_measured_jacobi():
    prior = {"ar_above_batch": 8, "break_even_tpf": None}
    methods = run(Dispatch(), 16, {"jacobi": 300, "ar": 100}, 40, **prior)
    assert methods[:3] == ["ar", "jacobi", "jacobi"]  # the prior, its probe, then what the server measured
    assert [i for i, m in enumerate(methods) if m == "ar"] == [0, 16]  # a 3x gap: probed every 32nd batch


def test_measured_ar_wins_over_a_too_optimistic_crossover_and_other_buckets_keep_the_prior():
    d = Dispatch()
    prior = {"ar_above_batch": None, "break_even_tpf": None}
    methods = run(d, 32, {"jacobi": 100, "ar": 250}, 40, **prior)
    assert methods[:3] == ["jacobi", "ar", "ar"] and [i for i, m in enumerate(methods) if m == "jacobi"] == [0, 16]
    assert d.choose(1, **prior) == "jacobi"  # batch 1 is another bucket: nothing measured there yet


def test_a_confident_crossover_probes_rarely_from_the_start():
    methods = run(
        Dispatch(), 1, {"jacobi": 300, "ar": 100}, 50, ar_above_batch=16, break_even_tpf=None, prior_speedup=3.0
    )
    assert [i for i, m in enumerate(methods) if m == "ar"] == [16, 48]
    crossover = Crossover([2, 4, 8], [2.5, 1.2, 0.8], [3.0, 2.9, 2.8])
    prior = ServingPrior.measured(crossover, "cpu", "float32")
    assert [prior.speedup_at(b) for b in (1, 3, 8, 64)] == [2.5, 2.5, 0.8, 0.8]  # below the smallest: the smallest
    assert prior.ar_above_batch == 4 and prior.break_even_tpf == 1.2
    assert ServingPrior.of_block(prior.block()) == prior and ServingPrior.of_block({"decode": {}}) is None


def test_close_rates_are_probed_every_8th_batch():
    methods = run(Dispatch(), 4, {"jacobi": 130, "ar": 100}, 20, ar_above_batch=None, break_even_tpf=None)
    assert [i for i, m in enumerate(methods) if m == "ar"] == [1, 9, 17]


def test_a_margin_keeps_noise_from_overriding_the_prior():
    methods = run(Dispatch(), 16, {"jacobi": 120, "ar": 100}, 9, ar_above_batch=8, break_even_tpf=None)
    assert methods.count("jacobi") == 1  # only the probe
    # Jacobi at batch 1 on prompts it accepts 3x more or less of, AR steady: a run of hard prompts is not a switch.
    noisy = {"jacobi": [450, 150, 120, 130, 500, 140, 420, 125, 135], "ar": 110}
    methods = run(Dispatch(), 1, noisy, 64, ar_above_batch=16, break_even_tpf=None, prior_speedup=2.7)
    assert [i for i, m in enumerate(methods) if m == "ar"] == [16, 48]  # the probes only


def test_a_change_in_speed_is_followed():
    d = Dispatch()
    prior = {"ar_above_batch": None, "break_even_tpf": None}
    run(d, 4, {"jacobi": 300, "ar": 100}, 9, **prior)
    later = run(d, 4, {"jacobi": 50, "ar": 100}, 20, **prior)  # e.g. prompts the model accepts little of
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


def test_a_batch_the_crossover_sends_to_ar_is_recorded_as_ars(tiny_model):
    """The stats say which decoder ran, not a TPF that a Jacobi decoder accepting nothing would also give: the
    evaluation's spread pairs a row with AR's only where our AR decoded every prompt."""
    from jf_core.decoding import JacobiConfig
    from jf_core.decoding.common import StopTokens, decode_batched
    from jf_core.decoding.dispatch import decode

    prompts = [[5, 9, 13], [7, 11, 3, 4]]
    cfg = JacobiConfig(block_size=4, max_new_tokens=12)

    def share(batch_size: int) -> float:
        run = lambda batch: decode(tiny_model, batch, cfg, stop=StopTokens(2, 0), ar_above_batch=1)  # noqa: E731
        return decode_batched(run, prompts, batch_size).stats.ar_share

    assert share(2) == 1.0  # above the crossover: AR
    assert share(1) == 0.0  # at it: Jacobi, whatever its TPF
