"""`jf bench decode`: every decoding method on the same prompts, in one run, side by side.

Each method gets a warmup on a few prompts, then all decode the same prompts at the same batch size, taking turns
batch by batch (`run_interleaved`), so the drifting speed of a CPU hits every method alike. Outputs are compared
with HF greedy `generate` (the reference for `identical_fraction`) and, when the prompts come with a scorer, with
the task's answers (`accuracy`). Forwards of HF methods are counted with a forward hook on the model, so their TPF
is measured, not assumed. HF methods cannot separate prefill from decoding; theirs is reported as null, and TPS is
end to end (prefill included) for every method. Ratios are computed here, from numbers taken in this run.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import (
    DecodeOutput,
    EosIds,
    batches_of,
    concat_outputs,
    decode_batched,
    eos_set,
    finish,
    left_pad,
)
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.decoding.sampling import Sampling
from jf_core.decoding.stats import DecodeStats, SequenceStats, Timer

Decoder = Callable[[list[list[int]]], DecodeOutput]
Scorer = Callable[[int, list[int]], bool]  # (prompt index, generated ids) -> correct?


@dataclass
class MethodResult:
    method: str
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


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(reference, candidate, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


class ForwardCounter:
    """Counts `model.forward` calls (one per decoding step of HF generate, prefill included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


@contextlib.contextmanager
def _pristine_generation_config(model) -> Iterator[None]:
    """transformers fills every field a passed GenerationConfig leaves unset from the checkpoint's
    generation_config.json (Qwen instruct ships repetition_penalty 1.05, top_k, top_p, ...): during the call the
    model's own config is a blank one, so nothing but what we pass applies."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def greedy_generation_config(eos_token_id: EosIds, pad_token_id: int, max_new_tokens: int, **extra):
    """Plain greedy search, explicitly: no penalties, no sampling knobs, every EOS id."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=sorted(eos_set(eos_token_id)) or None,
        pad_token_id=pad_token_id,
        **extra,
    )


def hf_generate_decoder(
    model, eos_token_id: EosIds, pad_token_id: int, max_new_tokens: int, *, batched: bool = True, **generate_kwargs
) -> Decoder:
    """HF `generate`, greedy and nothing else (`greedy_generation_config`), wrapped to the project's decoder
    interface: left-padded batches like our decoders, or one call per prompt for methods that only run at batch 1
    (prompt lookup: `batched=False`). Forwards are counted by a hook; a sequence's TPF counts the batch forwards it
    took part in (through its EOS)."""
    eos = eos_set(eos_token_id)
    gen_config = greedy_generation_config(eos, pad_token_id, max_new_tokens, **generate_kwargs)

    def run(prompts: list[list[int]]) -> tuple[list[list[int]], int]:
        ids, mask = left_pad(prompts, pad_token_id, model.device)
        counter = ForwardCounter(model)
        with _pristine_generation_config(model):
            try:
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config)
            finally:
                counter.close()
        return out[:, ids.shape[1] :].tolist(), counter.count

    def decode(prompts: list[list[int]]) -> DecodeOutput:
        timer = Timer(model.device)
        start = timer.now()
        groups = [prompts] if batched else [[p] for p in prompts]
        seqs, stats = [], []
        for group in groups:
            rows, forwards = run(group)
            for row in rows:
                tokens, _ = finish(row, eos, max_new_tokens)
                seqs.append(tokens)
                # At batch 1 the hook counts this sequence's forwards; in a batch, one per token it generated.
                taken = forwards if len(group) == 1 else len(tokens)
                stats.append(SequenceStats(new_tokens=len(tokens), forwards=taken))
        return DecodeOutput(seqs, DecodeStats(stats, decode_seconds=timer.now() - start, prefill_timed=False))

    return decode


def standard_methods(
    model,
    *,
    eos_token_id: EosIds,
    pad_token_id: int,
    max_new_tokens: int,
    block_sizes: Sequence[int] = (8, 16, 32, 64),
    prompt_lookup_tokens: int = 10,
) -> dict[str, Decoder]:
    methods: dict[str, Decoder] = {
        "hf_generate": hf_generate_decoder(model, eos_token_id, pad_token_id, max_new_tokens),
        "ar": lambda ps: ar_decode(
            model, ps, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        ),
    }
    for n in block_sizes:
        cfg = JacobiConfig(block_size=n, max_new_tokens=max_new_tokens)
        methods[f"jacobi_n{n}"] = lambda ps, cfg=cfg: jacobi_decode(
            model, ps, cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
    methods["hf_prompt_lookup"] = hf_generate_decoder(  # batch 1 only in transformers
        model, eos_token_id, pad_token_id, max_new_tokens, batched=False, prompt_lookup_num_tokens=prompt_lookup_tokens
    )
    return methods


def jf_methods(
    jf_model,
    *,
    eos_token_id: EosIds,
    pad_token_id: int,
    max_new_tokens: int,
    block_size: int,
    tuned: JacobiConfig | None = None,
    sampling: Sampling | None = None,
    ar_above_batch: int | None = None,
    jacobi_block_sizes: Sequence[int] = (),
) -> tuple[dict[str, Decoder], dict[str, str]]:
    """The Jacobi Forcing model's methods (vanilla Jacobi at `block_size` and each of `jacobi_block_sizes`, so its
    TPF can be drawn against the base model's at each n; + recycling, + multi-block, + both, the autotuned
    config, and with adaptive width in it the same config at full width, always Jacobi) and its own AR, which
    they must reproduce token for token; returns (methods, same_output_as).

    With `sampling` every one of them samples, each prompt with a seed of its own tokens (the same in every method
    and batch), so "identical" checks that sampled decoding is lossless and TPF is measured under sampling. The
    autotuned row is the model's default decode path: with `ar_above_batch` (its stored crossover) it runs AR on
    batches above it."""
    from jf_core.decoding import decode
    from jf_core.decoding.multiblock import JFDecodeConfig

    n = block_size
    configs: dict[str, JacobiConfig] = {
        f"jf_jacobi_n{m}": JacobiConfig(block_size=m, max_new_tokens=max_new_tokens)
        for m in sorted({n, *jacobi_block_sizes})
    }
    configs |= {
        "jf_recycling": JFDecodeConfig(
            block_size=n, num_blocks=1, pool_size=4, seed_drafts=True, max_new_tokens=max_new_tokens
        ),
        "jf_multiblock": JFDecodeConfig(block_size=n, num_blocks=2, pool_size=0, max_new_tokens=max_new_tokens),
        "jf_recycling_multiblock": JFDecodeConfig(block_size=n, seed_drafts=True, max_new_tokens=max_new_tokens),
    }
    if tuned is not None:
        from dataclasses import replace

        configs["jf_autotuned"] = replace(tuned, max_new_tokens=max_new_tokens)
        if getattr(tuned, "adaptive_width", False):  # what adaptive width brings: the same config, full windows
            configs["jf_autotuned_full_width"] = replace(tuned, max_new_tokens=max_new_tokens, adaptive_width=False)
    stops = {"eos_token_id": eos_token_id, "pad_token_id": pad_token_id, "sampling": sampling}
    methods: dict[str, Decoder] = {
        "jf_ar": lambda ps: ar_decode(
            jf_model, ps, max_new_tokens=max_new_tokens, seeds=prompt_seeds(ps) if sampling else None, **stops
        )
    }
    for name, cfg in configs.items():
        above = ar_above_batch if name == "jf_autotuned" else None
        methods[name] = lambda ps, cfg=cfg, above=above: decode(
            jf_model, ps, cfg, seeds=prompt_seeds(ps) if sampling else None, ar_above_batch=above, **stops
        )
    return methods, {name: "jf_ar" for name in methods}


def prompt_seeds(prompts: Sequence[Sequence[int]]) -> list[int]:
    """A sampling seed per prompt from its tokens: the same whichever method or batch decodes it."""
    return [zlib.crc32(",".join(map(str, p)).encode()) for p in prompts]


def run_interleaved(
    decoders: dict[str, Decoder],
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    *,
    repeats: int = 1,
    warmup_prompts: int = 2,
    progress: Callable[[str], None] | None = None,
    say_every: float = 10.0,
) -> dict[str, DecodeOutput]:
    """Every decoder over `prompts`, taking turns batch by batch; with `repeats`, each batch runs that many times
    per decoder and its fastest run counts. `progress` gets a line at the start of each run and, at most every
    `say_every` seconds and at the end, how far it is.

    On a shared or boosting CPU the speed of the machine drifts over seconds (turbo budgets run out, neighbours
    wake up). Running method after method lets that drift decide a comparison; taking turns on each batch exposes
    every method to the same machine, and keeping each batch's fastest run drops the spikes."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    batches = batches_of(prompts, batch_size)
    say = progress or (lambda _m: None)
    started = time.perf_counter()
    if warmup_prompts:
        say(f"warming up {len(decoders)} methods on {min(warmup_prompts, len(prompts))} prompts")
    for decoder in decoders.values():  # warm every code path before anything is timed
        decode_batched(decoder, prompts[:warmup_prompts], batch_size)
    best: dict[str, list[DecodeOutput | None]] = {name: [None] * len(batches) for name in decoders}
    total, done, said = repeats * len(batches), 0, started
    for rep in range(repeats):
        say(f"run {rep + 1}/{repeats}: {len(decoders)} methods taking turns on {len(batches)} batches")
        for b, batch in enumerate(batches):
            for name, decoder in decoders.items():
                out = decoder(batch)
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
    return {name: concat_outputs(outs) for name, outs in best.items()}


def bench(
    methods: dict[str, Decoder],
    prompts: list[list[int]],
    *,
    batch_size: int = 1,
    warmup_prompts: int = 2,
    repeats: int = 1,
    scorer: Scorer | None = None,
    reference: str | None = "hf_generate",
    baseline_ar: str = "ar",
    progress: Callable[[str], None] | None = None,
    same_output_as: dict[str, str] | None = None,
    describe: Callable[[list[list[int]]], dict[str, float]] | None = None,
) -> list[MethodResult]:
    """Speedups are against `reference` (HF generate, when it is among the methods) and `baseline_ar` (our AR on
    the same model: the headline). `describe` summarises each method's outputs (e.g. `degeneracy.output_stats`).
    Identity compares each method with `same_output_as[method]` (default
    `baseline_ar`), e.g. a fine-tuned model's methods with that model's own greedy AR: the fraction of identical
    outputs and, per prompt, the first position where they diverge. Timing: `run_interleaved`."""
    for name in filter(None, (reference, baseline_ar)):
        if name not in methods and not (name == reference and reference == "hf_generate"):
            raise ValueError(f"the reference method {name!r} is not among {sorted(methods)}")
    same_output_as = same_output_as or {}
    outputs = run_interleaved(
        methods, prompts, batch_size, repeats=repeats, warmup_prompts=warmup_prompts, progress=progress
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
            )
        )
    return results


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


TABLE_COLUMNS = ("method", "TPF", "TPF p10/p50/p90", "TPS", "x HF gen", "x AR", "identical", "accuracy", "prefill s")


def table_rows(results: list[MethodResult]) -> list[list[str]]:
    rows = []
    for r in results:
        dist = "/".join(f"{_percentile(r.tpf_per_example, q):.2f}" for q in (0.1, 0.5, 0.9))
        rows.append(
            [
                r.method,
                f"{r.tpf:.2f}",
                dist,
                f"{r.tps:.1f}",
                f"{r.speedup_vs_hf_generate:.2f}",
                f"{r.speedup_vs_ar:.2f}",
                f"{r.identical_fraction:.3f}",
                "-" if r.accuracy is None else f"{r.accuracy:.3f}",
                "-" if r.prefill_seconds is None else f"{r.prefill_seconds:.3f}",
            ]
        )
    return rows


def format_table(results: list[MethodResult]) -> str:
    rows = [list(TABLE_COLUMNS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_markdown(results: list[MethodResult]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join(lines)


def write_json(results: list[MethodResult], path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "methods": {r.method: asdict(r) for r in results}}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
