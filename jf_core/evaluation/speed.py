"""The one timer: every method on the same prompts, in one run, side by side (`run_interleaved`), and each
method's row from it (`bench`). The methods are built in methods.py, the rows written in tables.py.

Each method gets a warmup on a few prompts, then all decode the same prompts at the same batch size, taking turns
batch by batch, so the drifting speed of a CPU hits every method alike. Outputs are compared with a reference method
(`identical_fraction`: our AR on the same model, or the method `same_output_as` names) and, when the prompts come
with a scorer, with the task's answers (`accuracy`). HF methods cannot separate prefill from decoding; theirs is
reported as null, and TPS is end to end (prefill included) for every method. Ratios are computed here, from numbers
taken in this run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from jf_core.decoding import DecodeOutput
from jf_core.decoding.common import batches_of, concat_outputs, decode_batched
from jf_core.evaluation.method import AR, HF_GENERATE, Method

Decoder = Callable[[list[list[int]]], DecodeOutput]
K = TypeVar("K")  # what names a decoder: a `Method` for table rows, a block size or a word for a calibration
Scorer = Callable[[int, list[int]], bool]  # (prompt index, generated ids) -> correct?
# Prompts each method decodes untimed before a pass: one decoded to the end runs every code path the timed ones
# will (prefill, the decode loop, the cache's growth). Two took 2.3 of a SmolLM2 round's 21 evaluation minutes
# at batch 1 (2026-12-03), and as long again in each tune of 4 calibration prompts.
WARMUP_PROMPTS = 1
MAX_RUNS = 32  # `min_seconds`' cap on a pass's runs: a batch of a millisecond must not run a thousand times


@dataclass
class MethodResult:
    method: Method
    tpf: float
    tps: float
    decode_tps: float | None
    prefill_seconds: float | None
    seconds: float
    new_tokens: int
    speedup_vs_hf_generate: float = math.nan
    speedup_vs_ar: float = math.nan
    identical_fraction: float = math.nan
    accuracy: float | None = None
    tpf_per_example: list[float] = field(default_factory=list)
    accepted_histogram: dict[int, int] = field(default_factory=dict)
    first_divergence: list[int | None] = field(default_factory=list)  # per prompt: None when identical
    output_stats: dict[str, float] = field(default_factory=dict)  # `describe` of the outputs (degeneracy.py)
    outputs: list[list[int]] = field(default_factory=list)  # the new tokens per prompt, where `bench` kept them
    ar_share: float = 0.0  # of the prompts, those our AR decoded (a dispatch's AR batches; 1.0 for AR's own rows)
    # Each batch's timed seconds (its fastest run) and new tokens, in the prompts' order: the same batches in every
    # row of one pass, so two rows compare batch by batch (`ratio_interval`).
    batch_seconds: list[float] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.method.label


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(reference, candidate, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def whole_batches(prompts: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """`prompts` cycled to fill at least one batch of `size`, cut to whole batches: a ragged last batch would be
    timed at a smaller size."""
    pool = [list(prompts[i % len(prompts)]) for i in range(max(size, len(prompts)))]
    return pool[: size * max(1, len(pool) // size)]


def run_interleaved(
    decoders: dict[K, Decoder],
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    *,
    repeats: int = 1,
    warmup_prompts: int = WARMUP_PROMPTS,
    progress: Callable[[str], None] | None = None,
    say_every: float = 10.0,
    min_seconds: float = 0.0,
) -> dict[K, DecodeOutput]:
    """Every decoder over `prompts`, taking turns batch by batch; with `repeats`, each batch runs that many times
    per decoder and its fastest run counts. `progress` gets a line at the start of each run and, at most every
    `say_every` seconds and at the end, how far it is.

    On a shared or boosting CPU the speed of the machine drifts over seconds (turbo budgets run out, neighbours
    wake up). Running method after method lets that drift decide a comparison; taking turns on each batch exposes
    every method to the same machine, and keeping each batch's fastest run drops the spikes. The order of the turns
    rotates from batch to batch, so each method goes first as often as the others (to within one turn): a method
    always timed first (caches cold, or the core just boosted) would carry that order's bias into every ratio.

    `min_seconds`: after `repeats` runs, more runs (up to `MAX_RUNS` in all) until every decoder has spent at least
    this long timed. A pass of a few batches of milliseconds each (a small model at a large batch) is too short to
    time: four 80 ms batches read the same AR 0.19 apart (docs/decoding.md, "Four batches at batch 16")."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if min_seconds < 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    batches = batches_of(prompts, batch_size)
    say = progress or (lambda _m: None)
    started = time.perf_counter()
    if warmup_prompts:
        say(f"warming up {len(decoders)} methods on {min(warmup_prompts, len(prompts))} prompts")
    for decoder in decoders.values():  # warm every code path before anything is timed
        decode_batched(decoder, prompts[:warmup_prompts], batch_size)
    best: dict[K, list[DecodeOutput | None]] = {name: [None] * len(batches) for name in decoders}
    spent = dict.fromkeys(decoders, 0.0)  # each decoder's timed seconds over every run
    total, done, said = repeats * len(batches), 0, started
    names = list(decoders)
    rep = 0
    planned = repeats  # runs: `repeats`, then as many as min_seconds is expected to need at the pace so far
    while rep < repeats or (rep < MAX_RUNS and min(spent.values()) < min_seconds):
        if rep >= repeats:
            pace = min(spent.values()) / rep  # the least-timed decoder's seconds a run
            planned = max(planned, rep + 1, min(MAX_RUNS, math.ceil(min_seconds / pace) if pace > 0 else MAX_RUNS))
            total = planned * len(batches)
        runs = f"{rep + 1}/{planned}" + ("" if rep < repeats else f" (until {min_seconds:g} s timed each)")
        say(f"run {runs}: {len(decoders)} methods taking turns on {len(batches)} batches")
        for b, batch in enumerate(batches):
            turn = (rep * len(batches) + b) % len(names)
            for name in names[turn:] + names[:turn]:
                out = decoders[name](batch)
                spent[name] += out.stats.seconds
                kept = best[name][b]
                if kept is None or out.stats.seconds < kept.stats.seconds:
                    best[name][b] = out
            done += 1
            # A real model on a CPU takes minutes per batch: say how far, and how long is left at this pace (the
            # toy's batches take a second: a line for each would bury the rest).
            now = time.perf_counter()
            if done == total or now - said >= say_every:
                said, elapsed = now, now - started
                say(
                    f"batch {done}/{total} ({len(batch)} prompts, every method): {elapsed:.0f} s, "
                    f"about {elapsed / done * (total - done):.0f} s left"
                )
        rep += 1
    return {name: concat_outputs(outs) for name, outs in best.items()}


def bench(
    methods: dict[Method, Decoder],
    prompts: list[list[int]],
    *,
    batch_size: int = 1,
    warmup_prompts: int = WARMUP_PROMPTS,
    repeats: int = 1,
    scorer: Scorer | None = None,
    reference: Method | None = HF_GENERATE,
    baseline_ar: Method = AR,
    progress: Callable[[str], None] | None = None,
    same_output_as: dict[Method, Method] | None = None,
    describe: Callable[[list[list[int]]], dict[str, float]] | None = None,
    keep_outputs: bool = False,
    min_seconds: float = 0.0,
) -> list[MethodResult]:
    """Speedups are against `reference` (HF generate, when it is among the methods) and `baseline_ar` (our AR on
        the same model: the headline). `describe` summarises each method's outputs (e.g. `degeneracy.output_stats`).
        Identity compares each method with `same_output_as[method]` (default
        `baseline_ar`), e.g. a fine-tuned model's methods with that model's own greedy AR: the fraction of identical
        outputs and, per prompt, the first position where they diverge. `keep_outputs`: each row keeps its outputs (to
    compare them with another model's). Timing: `run_interleaved` (`repeats` runs, more until each method has
    `min_seconds` timed)."""
    for name in filter(None, (reference, baseline_ar)):
        if name not in methods and not (name == reference == HF_GENERATE):  # HF's row is optional
            raise ValueError(f"the reference method {name} is not among {sorted(m.label for m in methods)}")
    same_output_as = same_output_as or {}
    outputs = run_interleaved(
        methods,
        prompts,
        batch_size,
        repeats=repeats,
        warmup_prompts=warmup_prompts,
        progress=progress,
        min_seconds=min_seconds,
    )
    ref = outputs.get(reference) if reference else None
    ar = outputs.get(baseline_ar)
    results = []
    for name, out in outputs.items():
        s = out.stats
        twin = outputs[same_output_as.get(name, baseline_ar if ar is not None else name)]
        diverged = [first_divergence(a, b) for a, b in zip(twin.sequences, out.sequences, strict=True)]
        hf_style = not s.prefill_timed
        results.append(
            MethodResult(
                method=name,
                tpf=s.tpf,
                tps=s.tps,
                decode_tps=None if hf_style else s.decode_tps,
                prefill_seconds=None if hf_style else s.prefill_seconds,
                seconds=s.seconds,
                new_tokens=s.new_tokens,
                speedup_vs_hf_generate=s.tps / ref.stats.tps if ref is not None else math.nan,
                speedup_vs_ar=s.tps / ar.stats.tps if ar is not None else math.nan,
                identical_fraction=sum(d is None for d in diverged) / len(prompts),
                accuracy=None
                if scorer is None
                else sum(scorer(i, seq) for i, seq in enumerate(out.sequences)) / len(prompts),
                tpf_per_example=[q.tpf for q in s.sequences],
                accepted_histogram=s.accepted_histogram(),
                first_divergence=diverged,
                output_stats={} if describe is None else describe(out.sequences),
                outputs=[list(seq) for seq in out.sequences] if keep_outputs else [],
                ar_share=s.ar_share,
                batch_seconds=s.batches(),
                batch_tokens=[
                    sum(q.new_tokens for q in s.sequences[i : i + batch_size])
                    for i in range(0, len(s.sequences), batch_size)
                ],
            )
        )
    return results


# Resamples of `ratio_interval`'s bootstrap (a fixed seed: the same rows give the same interval in every report).
INTERVAL_DRAWS = 4000


def ratio_interval(
    a: MethodResult, b: MethodResult, level: float = 0.95, draws: int = INTERVAL_DRAWS, seed: int = 0
) -> tuple[float, float] | None:
    """Where `a`'s tokens/s over `b`'s would land on other prompts like these: the central `level` of a paired
    bootstrap over the batches both decoded (resampled together, each keeping both rows' seconds and tokens). The
    run's AR-against-AR control says how far the timer moves on the same work; this says how much the ratio owes to
    which prompts were drawn: on 12 GSM8K questions a decoder's speed over another's moved from 1.12x on the reported
    half to 1.25x on 8 development questions (2026-12-06). None where either row lacks its batches (a row cached
    before they were kept) or they are not the same batches, or there are fewer than two."""
    n = len(a.batch_seconds)
    if n < 2 or not len(a.batch_tokens) == len(b.batch_seconds) == len(b.batch_tokens) == n:
        return None
    return paired_ratio_interval(a.batch_tokens, a.batch_seconds, b.batch_tokens, b.batch_seconds, level, draws, seed)


def paired_ratio_interval(
    a_tokens: Sequence[float],
    a_seconds: Sequence[float],
    b_tokens: Sequence[float],
    b_seconds: Sequence[float],
    level: float = 0.95,
    draws: int = INTERVAL_DRAWS,
    seed: int = 0,
) -> tuple[float, float]:
    """The central `level` of a's tokens/s over b's when the prompts (or batches) both decoded are drawn again with
    replacement, each keeping both methods' tokens and seconds: `ratio_interval`'s bootstrap on plain lists."""
    import numpy as np

    n = len(a_seconds)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, n, size=(draws, n))
    a_tok, a_sec, b_tok, b_sec = (
        np.asarray(x, dtype=float)[pick].sum(axis=1) for x in (a_tokens, a_seconds, b_tokens, b_seconds)
    )
    ratios = (a_tok / a_sec) / (b_tok / b_sec)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
