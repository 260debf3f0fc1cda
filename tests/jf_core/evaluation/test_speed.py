"""The benchmark harness measures what it claims: behaviour only, never wall-clock thresholds."""

from __future__ import annotations

import json

import pytest

from jf_core.decoding.common import StopTokens
from jf_core.evaluation.method import AR, Method
from jf_core.evaluation.methods import build_methods
from jf_core.evaluation.speed import bench
from jf_core.evaluation.tables import format_table, write_json
from tests.conftest import PAD, TINY_MODELS


def test_every_method_runs_and_greedy_methods_agree(tmp_path):
    model = TINY_MODELS["qwen2"]()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [40, 41]]
    methods = build_methods(model, StopTokens(2, PAD), 24, hf=True, block_sizes=(8, 16))
    results = bench(methods, prompts, batch_size=2, warmup_prompts=1, scorer=lambda i, seq: len(seq) == 24)
    by_name = {r.name: r for r in results}
    assert list(by_name) == ["hf_generate", "hf_prompt_lookup", "ar", "jacobi_n8", "jacobi_n16"]
    for r in results:
        # every method is greedy and lossless, so all outputs equal HF greedy's
        assert r.identical_fraction == 1.0
        assert r.new_tokens == results[0].new_tokens
        assert r.accuracy == results[0].accuracy
        assert len(r.tpf_per_example) == len(prompts)
        assert r.tps > 0
    # the forward hook counts one prefill + one forward per further token for HF greedy
    assert by_name["hf_generate"].tpf == 1.0 and by_name["ar"].tpf == 1.0
    assert by_name["hf_generate"].speedup_vs_hf_generate == 1.0
    assert by_name["ar"].prefill_seconds is not None and by_name["hf_generate"].prefill_seconds is None
    assert "jacobi_n16" in format_table(results)
    write_json(results, tmp_path / "bench.json", {"note": "test"})
    data = json.loads((tmp_path / "bench.json").read_text())
    for key in ("tpf", "tps", "speedup_vs_hf_generate", "speedup_vs_ar", "identical_fraction", "accuracy"):
        assert key in data["methods"]["jacobi_n8"]


def test_jf_methods_reproduce_their_own_model_and_plots_are_written(tmp_path):
    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.evaluation.plots import bench_figures, save_figures, speed_against_batch_size
    from jf_core.evaluation.tables import format_markdown

    base, jf = TINY_MODELS["qwen2"](), TINY_MODELS["llama"]()  # two different models, as base and JF would be
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    methods = build_methods(base, StopTokens(2, PAD), 20, hf=True, block_sizes=(4, 8))
    tuned = JFDecodeConfig(block_size=8, num_blocks=2, pool_size=2, max_new_tokens=20, adaptive_width=True)
    extra = build_methods(
        jf, StopTokens(2, PAD), 20, model_tag="jf", block_sizes=(4, 8), variants_at=8, tuned=tuned,
        tuned_kind="autotuned", full_width=True,
    )  # fmt: skip
    same = dict.fromkeys(extra, AR.of("jf"))
    methods.update(extra)
    results = {r.name: r for r in bench(methods, prompts, warmup_prompts=1, same_output_as=same)}
    assert {m.label for m in extra} == {
        "jf_ar",
        "jf_jacobi_n4",
        "jf_jacobi_n8",
        "jf_recycling",
        "jf_multiblock",
        "jf_recycling_multiblock",
        "jf_autotuned",
        "jf_autotuned_full_width",
    }
    for method in extra:
        assert results[method.label].identical_fraction == 1.0, method  # lossless against the JF model's own greedy AR
    assert results["jacobi_n8"].identical_fraction == 1.0  # and the base methods against base HF greedy
    assert "| jf_autotuned |" in format_markdown(list(results.values()))
    rows = list(results.values())
    paths = save_figures(bench_figures(rows), tmp_path)
    # TPF against block size drawn too: both models have rows at n = 4 and 8
    assert [p.name for p in paths] == ["tpf_tps_per_method.png", "accepted_histogram.png", "tpf_against_block_size.png"]
    assert all(p.is_file() and p.stat().st_size > 1000 for p in paths)
    assert speed_against_batch_size({1: rows}) is None  # one batch size is no curve
    (curve,) = save_figures({"speed": speed_against_batch_size({1: rows, 4: rows})}, tmp_path)
    assert curve.stat().st_size > 1000 and not list(tmp_path.glob(".*.tmp"))


def test_tune_picks_the_fastest_measured_config_and_round_trips(tmp_path):
    from jf_core.decoding import load_decode_config
    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.evaluation.tune import TuneSpace, tune
    from jf_core.model_dir import save_decode_config

    model = TINY_MODELS["qwen2"]()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    knobs = {"block_size": [4, 8], "num_blocks": [1, 2], "pool_size": [0, 2], "spawn_ratio": [0.5, 0.85]}
    space = TuneSpace.of(**knobs, adaptive_width=[False])
    best, trials = tune(model, prompts, stop=StopTokens(None, PAD), max_new_tokens=16, space=space, repeats=2)
    assert len(trials) == 24  # r only varies when K > 1; every point with sampled and with seeded drafts
    assert max(t.tps for t in trials) == next(t.tps for t in trials if t.config == best)
    model.save_pretrained(tmp_path)
    save_decode_config(tmp_path, best)
    assert load_decode_config(tmp_path) == best and isinstance(load_decode_config(tmp_path), JFDecodeConfig)
    assert load_decode_config(tmp_path, block_size=32).block_size == 32


def test_successive_halving_stops_the_slower_half_at_each_rung_and_keeps_the_winner(monkeypatch):
    """The real decoders, on a clock where each configuration's speed is known (its tokens over a time set by its
    block size and K): 8 configurations over 6 prompts in 3 rungs run 8, 4, then 2 on 2 prompts each, the slower
    half stopping at each rung, and the winner is the fastest, measured on every prompt."""
    from dataclasses import replace

    from jf_core.decoding.common import DecodeOutput
    from jf_core.evaluation import tune as tuning

    def speed(cfg) -> float:  # tokens a second: distinct for every configuration of the grid below
        return 100.0 * cfg.block_size + 10.0 * cfg.num_blocks + (5.0 if cfg.seed_drafts else 0.0)

    real = tuning.decode

    def on_a_known_clock(model, prompts, cfg, **kw) -> DecodeOutput:
        out = real(model, prompts, cfg, **kw)
        seconds = out.stats.new_tokens / speed(cfg)
        return DecodeOutput(out.sequences, replace(out.stats, prefill_seconds=0.0, decode_seconds=seconds))

    monkeypatch.setattr(tuning, "decode", on_a_known_clock)
    model = TINY_MODELS["qwen2"]()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14], [15, 16, 17], [18, 19], [20, 21, 22]]
    grid = {"block_size": [4, 8], "num_blocks": [1, 2], "spawn_ratio": [0.5], "seed_drafts": [False, True]}
    space = tuning.TuneSpace.of(**grid, pool_size=[0], adaptive_width=[False])
    lines: list[str] = []
    best, trials = tuning.tune(
        model, prompts, stop=StopTokens(None, PAD), max_new_tokens=8, space=space, rungs=3, say=lines.append
    )
    ranked = sorted(trials, key=lambda t: -speed(t.config))
    assert best == ranked[0].config and len(trials) == 8
    assert [t.prompts for t in ranked] == [6, 6, 4, 4, 2, 2, 2, 2]
    assert any(line.startswith("rung 3/3: 2 configs, ") for line in lines)
    with pytest.raises(ValueError, match="rungs must be >= 1"):
        tuning.tune(model, prompts, stop=StopTokens(None, PAD), max_new_tokens=8, space=space, rungs=0)


def test_the_tuner_searches_adaptive_width():
    from jf_core.evaluation.tune import TuneSpace

    space = TuneSpace.of(
        block_size=[8], num_blocks=[2], pool_size=[0], spawn_ratio=[0.85], seed_drafts=[False],
        adaptive_width=[False, True], width_scale=[2.0], width_margin=[2, 4],
    )  # fmt: skip
    configs = space.configs(16)
    assert [(c.adaptive_width, c.width_scale, c.width_margin) for c in configs] == [
        (False, 1.5, 4),  # full width: the margins are not varied
        (True, 2.0, 2),
        (True, 2.0, 4),
    ]


def test_the_tuner_tries_a_draft_chains_span_only_for_a_model_with_an_adapter():
    from jf_core.evaluation.tune import TuneSpace

    space = TuneSpace.of(
        block_size=[4, 8], num_blocks=[1], pool_size=[0], seed_drafts=[False], adaptive_width=[False],
        draft_span=[0, 2, 6],
    )  # fmt: skip
    assert [(c.block_size, c.draft_span) for c in space.configs(16)] == [(4, 0), (8, 0)]
    # A span at or past n - 2 is the default chain again (n = 4: span 2; n = 8: span 6): not tried twice.
    assert [(c.block_size, c.draft_span) for c in space.configs(16, adapter=True)] == [(4, 0), (8, 0), (8, 2)]


def test_the_tuner_tries_prompt_lookup_where_the_profile_names_it():
    from jf_core.evaluation.tune import TuneSpace

    space = TuneSpace.of(
        block_size=[8], num_blocks=[1], pool_size=[0], seed_drafts=[False], adaptive_width=[False], lookup=[0, 16]
    )
    assert [(c.block_size, c.lookup) for c in space.configs(16)] == [(8, 0), (8, 16)]
    assert [c.lookup for c in TuneSpace.of().configs(16)] == [0] * len(TuneSpace.of().configs(16))  # off by default


def test_the_tuner_tries_suffix_drafts_only_for_a_model_with_a_draft_corpus(tmp_path):
    from jf_core.decoding.proposers.suffix import attach_corpus, save_corpus
    from jf_core.evaluation.tune import TuneSpace
    from jf_core.models import load_model
    from tests.jf_core.test_models import save_tiny

    space = TuneSpace.of(
        block_size=[8], num_blocks=[1], pool_size=[0], seed_drafts=[False], adaptive_width=[False], suffix=[0, 16]
    )
    assert [c.suffix for c in space.configs(16)] == [0]  # without a corpus suffix=16 decodes as 0: tried once
    assert [c.suffix for c in space.configs(16, corpus=True)] == [0, 16]
    save_tiny(tmp_path)
    save_corpus([[3, 4, 5]], tmp_path)
    model, _ = load_model(str(tmp_path))
    assert [c.suffix for c in space.for_model(model, 16)] == [0, 16]
    attach_corpus(model, None)
    assert [c.suffix for c in space.for_model(model, 16)] == [0]


def test_the_tuner_tries_the_adapter_off_only_once_a_width_and_only_for_a_model_with_one():
    """`adapter: [true, false]`: leaving the adapter out makes its chain's span moot (one config a width, not one a
    span), and on a model without an adapter both values decode alike (the untrained tune stays as it was)."""
    from jf_core.evaluation.tune import TuneSpace

    space = TuneSpace.of(
        block_size=[6, 8], num_blocks=[1], pool_size=[0], seed_drafts=[False], adaptive_width=[False],
        draft_span=[1, 3], adapter=[True, False],
    )  # fmt: skip
    got = [(c.block_size, c.adapter, c.draft_span) for c in space.configs(16, adapter=True)]
    assert sorted(got) == [(6, False, 0), (6, True, 1), (6, True, 3), (8, False, 0), (8, True, 1), (8, True, 3)]
    assert [(c.block_size, c.adapter, c.draft_span) for c in space.configs(16)] == [(6, True, 0), (8, True, 0)]


def test_interleaved_runs_take_turns_and_keep_each_batchs_fastest_run():
    """Decoders alternate batch by batch (so a drifting machine slows all alike), each first as often as the other,
    and each batch's fastest run is the one counted; outputs stay in prompt order."""
    from jf_core.decoding.common import DecodeOutput
    from jf_core.decoding.stats import DecodeStats, SequenceStats
    from jf_core.evaluation.speed import run_interleaved

    calls: list[tuple[str, int]] = []
    # Seconds of each call per (decoder, batch): the warmup (first batch only), then run 1 and run 2.
    seconds = {("a", 10): [9.0, 3.0, 1.0], ("a", 12): [3.0, 1.0], ("b", 10): [9.0, 2.0, 5.0], ("b", 12): [2.0, 5.0]}

    def decoder(name: str):
        def run(prompts: list[list[int]]) -> DecodeOutput:
            calls.append((name, prompts[0][0]))
            stats = [SequenceStats(new_tokens=1, forwards=1) for _ in prompts]
            spent = seconds[(name, prompts[0][0])].pop(0)
            return DecodeOutput([[p[0]] for p in prompts], DecodeStats(stats, decode_seconds=spent))

        return run

    prompts = [[10], [11], [12], [13]]
    out = run_interleaved({"a": decoder("a"), "b": decoder("b")}, prompts, 2, repeats=2, warmup_prompts=2)
    timed = calls[2:]  # after one warmup batch per decoder
    # Turns batch by batch, the order rotating: a first on batch 10 of run 1, b on batch 12, and so on.
    assert timed == [("a", 10), ("b", 10), ("b", 12), ("a", 12), ("a", 10), ("b", 10), ("b", 12), ("a", 12)]
    assert out["a"].sequences == [[10], [11], [12], [13]] == out["b"].sequences
    assert out["a"].stats.decode_seconds == 2 * 1.0 and out["b"].stats.decode_seconds == 2 * 2.0


def test_each_rows_batches_are_kept_and_the_ratios_interval_resamples_them_in_pairs():
    """A row keeps each batch's fastest seconds and its tokens (the same batches in every row), and the ratio of two
    rows' tokens/s gets a paired bootstrap interval over those batches: exact where every batch agrees, around the
    pooled ratio and within the batches' own ratios where they differ, and none where the batches cannot pair."""
    from dataclasses import replace

    from jf_core.decoding.common import DecodeOutput
    from jf_core.decoding.stats import DecodeStats, SequenceStats
    from jf_core.evaluation.speed import ratio_interval

    # Seconds per (decoder, first prompt of the batch); the warmup decodes the first batch once more.
    seconds = {"fast": {10: 1.0, 12: 1.0, 14: 2.0}, "slow": {10: 2.0, 12: 3.0, 14: 3.0}}

    def decoder(name: str):
        def run(prompts: list[list[int]]) -> DecodeOutput:
            stats = [SequenceStats(new_tokens=p[0] // 2, forwards=1) for p in prompts]
            return DecodeOutput(
                [[p[0]] for p in prompts], DecodeStats(stats, decode_seconds=seconds[name][prompts[0][0]])
            )

        return run

    prompts = [[10], [11], [12], [13], [14]]
    fast_m, slow_m = Method("ar", model="fast"), Method("ar", model="slow")
    decoders = {fast_m: decoder("fast"), slow_m: decoder("slow")}
    rows = {r.method: r for r in bench(decoders, prompts, batch_size=2, reference=None, baseline_ar=slow_m)}
    fast, slow = rows[fast_m], rows[slow_m]
    assert fast.batch_seconds == [1.0, 1.0, 2.0] and slow.batch_seconds == [2.0, 3.0, 3.0]
    assert fast.batch_tokens == [5 + 5, 6 + 6, 7] == slow.batch_tokens
    point = fast.tps / slow.tps
    low, high = ratio_interval(fast, slow)
    assert 1.5 <= low < point < high <= 3.0  # the batches' own ratios: 2, 3 and 1.5
    low, high = ratio_interval(fast, slow, level=0.5)  # resampled, not read off the batches' extremes
    assert 1.5 < low <= point <= high < 3.0
    assert ratio_interval(fast, fast) == (1.0, 1.0)
    doubled = replace(fast, batch_seconds=[2 * x for x in fast.batch_seconds])
    assert ratio_interval(fast, doubled) == pytest.approx((2.0, 2.0))
    assert ratio_interval(fast, replace(slow, batch_seconds=slow.batch_seconds[:2])) is None  # not the same batches
    one = {"batch_seconds": [1.0], "batch_tokens": [5]}
    assert ratio_interval(replace(fast, **one), replace(slow, **one)) is None  # one batch: nothing to resample


def test_interleaved_runs_go_on_until_every_decoder_has_min_seconds_timed_and_stop_at_the_cap():
    """A pass of short batches runs again (the turns still rotating) until the slowest-to-fill decoder has spent
    `min_seconds` timed; a decoder that takes no time stops at `MAX_RUNS`, not never."""
    from jf_core.decoding.common import DecodeOutput
    from jf_core.decoding.stats import DecodeStats, SequenceStats
    from jf_core.evaluation.speed import MAX_RUNS, run_interleaved

    calls: list[str] = []

    def decoder(name: str, seconds: float):
        def run(prompts: list[list[int]]) -> DecodeOutput:
            calls.append(name)
            stats = [SequenceStats(new_tokens=1, forwards=1) for _ in prompts]
            return DecodeOutput([[p[0]] for p in prompts], DecodeStats(stats, decode_seconds=seconds))

        return run

    prompts = [[10], [11], [12], [13]]
    # Two batches a run: `a` spends 0.25 s a run, `b` 0.75 s: 1 s timed each takes 4 runs (b has 3 s by then).
    said: list[str] = []
    out = run_interleaved(
        {"a": decoder("a", 0.125), "b": decoder("b", 0.375)}, prompts, 2, repeats=1, warmup_prompts=0,
        min_seconds=1.0, progress=said.append, say_every=0.0,
    )  # fmt: skip
    assert len(calls) == 4 * 2 * 2 and calls.count("a") == calls.count("b")
    # The progress counts against the runs min_seconds needs at the first run's pace: 8 batches from the second run
    # on, a total that does not grow run by run.
    counted = [line.split(" (")[0] for line in said if line.startswith("batch")]
    assert counted == ["batch 1/2", "batch 2/2"] + [f"batch {k}/8" for k in range(3, 9)]
    assert calls[:4] == ["a", "b", "b", "a"] and calls[4:8] == ["a", "b", "b", "a"]  # each batch's turn rotates
    assert out["a"].sequences == [[10], [11], [12], [13]]
    calls.clear()
    run_interleaved({"a": decoder("a", 0.0)}, prompts, 2, repeats=1, warmup_prompts=0, min_seconds=1.0)
    assert len(calls) == MAX_RUNS * 2
    calls.clear()
    run_interleaved({"a": decoder("a", 0.1)}, prompts, 2, repeats=3, warmup_prompts=0, min_seconds=0.0)
    assert len(calls) == 3 * 2  # without it, `repeats` runs exactly
    with pytest.raises(ValueError, match="min_seconds"):
        run_interleaved({"a": decoder("a", 0.1)}, prompts, 2, min_seconds=-1.0)


def test_jf_methods_sample_losslessly_with_a_seed_per_prompt():
    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.decoding.sampling import Sampling

    jf = TINY_MODELS["llama"]()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    tuned = JFDecodeConfig(block_size=8, num_blocks=2, pool_size=2, max_new_tokens=20)
    common = {"model_tag": "jf", "block_sizes": (8,), "variants_at": 8, "tuned_kind": "autotuned", "full_width": True}
    sampled = build_methods(jf, StopTokens(2, PAD), 20, **common, tuned=tuned, sampling=Sampling(1.0, top_k=20))
    greedy = build_methods(jf, StopTokens(2, PAD), 20, **common)
    same = dict.fromkeys(sampled, AR.of("jf"))
    # Batches of 2 and 1: a prompt's seed comes with it, so every method and batching draws the same sample.
    results = bench(
        sampled, prompts, batch_size=2, warmup_prompts=1, same_output_as=same, reference=None, baseline_ar=AR.of("jf")
    )
    assert all(r.identical_fraction == 1.0 for r in results), [(r.name, r.identical_fraction) for r in results]
    assert sampled[AR.of("jf")](prompts).sequences != greedy[AR.of("jf")](prompts).sequences


def test_the_autotuned_row_runs_ar_above_the_stored_crossover(embedded):
    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.toy.task import make_split

    model, tok = embedded
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 2)]
    tuned = JFDecodeConfig(block_size=16, num_blocks=2, pool_size=2, max_new_tokens=64)
    stop = StopTokens(tok.eos_token_id, tok.pad_token_id)
    methods = build_methods(model, stop, 64, model_tag="jf", tuned=tuned, tuned_kind="autotuned", ar_above_batch=1)
    ar, autotuned = methods[AR.of("jf")], methods[Method("autotuned", model="jf")]
    ar = ar(prompts)
    above = autotuned(prompts)  # batch 2 > 1: AR, forward for forward
    assert above.sequences == ar.sequences and above.stats.forwards == ar.stats.forwards
    alone = autotuned(prompts[:1])  # batch 1: the tuned Jacobi Forcing config
    assert alone.sequences == ar.sequences[:1]
    assert alone.stats.forwards < methods[AR.of("jf")](prompts[:1]).stats.forwards


def test_interleaved_runs_say_how_far_they_are_at_most_every_say_every_seconds():
    """Every batch when asked to (a real model's batches take minutes), else only the start and the end: a toy's
    hundred one-second batches would bury the log."""
    from jf_core.decoding.common import DecodeOutput
    from jf_core.decoding.stats import DecodeStats, SequenceStats
    from jf_core.evaluation.speed import run_interleaved

    def decoder(prompts: list[list[int]]) -> DecodeOutput:
        stats = [SequenceStats(new_tokens=1, forwards=1) for _ in prompts]
        return DecodeOutput([[p[0]] for p in prompts], DecodeStats(stats, decode_seconds=0.001))

    prompts = [[i] for i in range(6)]
    for every, said in ((0.0, ["1/6", "2/6", "3/6", "4/6", "5/6", "6/6"]), (3600.0, ["6/6"])):
        lines: list[str] = []
        run_interleaved({"a": decoder}, prompts, 1, progress=lines.append, say_every=every)
        batches = [line.split()[1] for line in lines if line.startswith("batch ")]
        assert batches == said and lines[0].startswith("warming up") and lines[1].startswith("run 1/1")
