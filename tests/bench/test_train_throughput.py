"""bench/train_throughput.py on the tiny Qwen2: each option trains through the round's own driver and its tokens
a second come from the training history's step times and the tokens the trainer counted."""

from __future__ import annotations

import pytest
import torch

from bench.train_throughput import measure, step_seconds, stretches, timed_profile
from jf_core.experiments.variants import variant_profile
from jf_core.models import load_model
from jf_core.trajectory.collect import collect
from jf_core.trajectory.prompts import load_prompts


def test_step_seconds_is_the_median_gap_after_step_zero():
    history = [{"step": 0.0, "elapsed_s": 5.0}, {"step": 1.0, "elapsed_s": 6.0}, {"step": 1.0, "probe": 1.0},
               {"step": 2.0, "elapsed_s": 8.0}, {"step": 4.0, "elapsed_s": 9.0}]  # fmt: skip
    assert step_seconds(history) == 1.0  # gaps 1, 2, 0.5 a step
    with pytest.raises(ValueError, match="two logged steps"):
        step_seconds(history[:1])


def test_stretches_split_each_step_into_its_context_passes_and_the_rest():
    history = [{"step": 0.0, "elapsed_s": 0.0, "context_miss_s": 0.0, "context_hits": 0.0},
               {"step": 1.0, "elapsed_s": 3.0, "context_miss_s": 1.0, "context_hits": 0.0},
               {"step": 1.0, "probe": 1.0},  # a probe's row: no step of its own
               {"step": 2.0, "elapsed_s": 7.0, "context_miss_s": 2.0, "context_hits": 1.0},
               {"step": 3.0, "elapsed_s": 9.0, "context_miss_s": 2.0, "context_hits": 3.0}]  # fmt: skip
    first, second = stretches(history, 2)
    assert first == {"steps": "0-1", "step_s": 3.0, "context_pass_s": 1.0, "rest_s": 2.0, "hits_a_step": 0.0}
    assert second == {"steps": "2-3", "step_s": 3.0, "context_pass_s": 0.5, "rest_s": 2.5, "hits_a_step": 1.5}
    assert stretches([{"step": 0.0, "elapsed_s": 1.0}, {"step": 1.0, "elapsed_s": 2.5}], 10)[0]["rest_s"] == 1.5


def test_a_timed_run_neither_probes_nor_decodes_on_policy(profile):
    """Even where the profile probes TPF or refreshes states on policy (the SmolLM2 profile probes every 200 steps):
    a decode inside the timed steps would be timed as training."""
    probing = variant_profile(
        profile, {"training": {"tpf_probe_every": 1, "onpolicy_every": 1, "state_pick": "each_visit"}}
    )
    timed = timed_profile(probing, {"batch_size": 2}, 300).training
    assert timed.tpf_probe_every is None and timed.onpolicy_every is None
    assert (timed.steps, timed.batch_size, timed.warmup_steps) == (300, 2, 0)


def test_options_train_and_count_their_tokens(profile, tmp_path):
    model, tok = load_model(profile.model.path)
    items = load_prompts(profile.prompts.model_copy(update={"limit": 4}), tok).items
    cfg = profile.trajectory.model_copy(update={"kind": "synthetic"}).collect_config()
    records = collect(model, tok, items, cfg, model_hash="t").records
    one = measure(profile, profile.model.path, records, {"batch_size": 1, "grad_accum": 2}, 4, tmp_path / "a")
    two = measure(profile, profile.model.path, records, {"batch_size": 2, "grad_accum": 2}, 4, tmp_path / "b")
    copies = {"batch_size": 1, "grad_accum": 2, "state_pick": "each_visit", "noisy_copies": 3}
    three = measure(profile, profile.model.path, records, copies, 4, tmp_path / "c")
    clean = {"batch_size": 1, "grad_accum": 2, "mask": "clean_context", "draft_span": 2}
    blocks = measure(profile, profile.model.path, records, clean, 4, tmp_path / "d")
    spans = measure(profile, profile.model.path, records, {**clean, "packing": "spans"}, 4, tmp_path / "e")
    assert two["tokens_per_step"] == pytest.approx(2 * one["tokens_per_step"])
    assert three["tokens_per_step"] > one["tokens_per_step"]  # the copies' tokens are counted
    assert three["students_per_step"] > one["students_per_step"] > 0
    # the same students from fewer tokens: the spans layout packs neither the noisy prefixes nor the unread tails
    assert spans["students_per_step"] == blocks["students_per_step"] > 0
    assert spans["tokens_per_step"] < blocks["tokens_per_step"]
    for row in (one, two, three, blocks, spans):
        assert row["step_seconds"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / row["step_seconds"])
        assert [h["step"] for h in row["history"] if "elapsed_s" in h] == [0.0, 1.0, 2.0, 3.0]  # a row a step


def test_an_options_flops_a_step_are_counted_and_the_machine_measured(profile, tmp_path):
    """`--flops`: two packed sequences a step count about twice one's FLOPs (the lean head's one check forward before
    training, counted in both, keeps it under 2x); the machine's matmul rate is a measured, positive figure."""
    from bench.train_throughput import counted_flops, matmul_gflops

    model, tok = load_model(profile.model.path)
    items = load_prompts(profile.prompts.model_copy(update={"limit": 2}), tok).items
    cfg = profile.trajectory.model_copy(update={"kind": "synthetic"}).collect_config()
    records = collect(model, tok, items, cfg, model_hash="t").records
    one, dtype = counted_flops(
        profile, profile.model.path, records, {"batch_size": 1, "grad_accum": 1}, 4, tmp_path / "a"
    )
    two, _ = counted_flops(profile, profile.model.path, records, {"batch_size": 1, "grad_accum": 2}, 4, tmp_path / "b")
    assert 1.4 * one < two < 2.2 * one and dtype == "float32"
    assert matmul_gflops(torch.float32, repeats=2) > 0 and matmul_gflops(torch.bfloat16, repeats=2) > 0


def test_an_option_s_off_switches_are_off_for_its_runs_only():
    from bench.train_throughput import switched
    from jf_core.decoding import grouped_attention
    from jf_core.layers import heads
    from jf_core.training import head, losses

    with switched({"off": ["head_cast", "eager_backward", "gradient_now", "ar_cut"], "threads": 1}):
        assert not heads._switch["cast"] and not grouped_attention._switch["eager"]
        assert not head._switch["gradient_now"] and not losses._switch["ar_cut"]
    assert heads._switch["cast"] and grouped_attention._switch["eager"]
    assert head._switch["gradient_now"] and losses._switch["ar_cut"]
    with pytest.raises(ValueError, match="unknown switch 'heads'"), switched({"off": ["heads"]}):
        pass


def test_an_options_ops_are_ranked_by_their_self_time_a_step(profile, tmp_path):
    """`--ops`: the ops of most self time over a run of the option's steps, in ms a step, ranked, the matrix
    products among them; by op and by op and shapes."""
    from types import SimpleNamespace

    from bench.train_throughput import top_ops

    model, tok = load_model(profile.model.path)
    items = load_prompts(profile.prompts.model_copy(update={"limit": 2}), tok).items
    cfg = profile.trajectory.model_copy(update={"kind": "synthetic"}).collect_config()
    records = collect(model, tok, items, cfg, model_hash="t").records
    args = SimpleNamespace(ops=12, steps=3, threads=1)
    found = top_ops(profile, profile.model.path, records, {"off": ["head_cast"]}, args, tmp_path / "ops")
    for ranking in (found["by_op"], found["by_shape"]):
        assert len(ranking) == 12
        times = [op["ms_a_step"] for op in ranking]
        assert times == sorted(times, reverse=True) and times[-1] > 0
    assert any(op["op"] in ("aten::mm", "aten::addmm", "aten::bmm") for op in found["by_op"])
    assert not (tmp_path / "ops").exists()
