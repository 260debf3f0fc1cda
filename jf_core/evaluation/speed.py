"""`jf bench decode`: every decoding method on the same prompts, in one run, side by side.

Each method gets a warmup on a few prompts, then all decode the same prompts at the same batch size, taking turns
batch by batch (`run_interleaved`), so the drifting speed of a CPU hits every method alike. Outputs are compared
with HF greedy `generate` (the reference for `identical_fraction`) and, when the prompts come with a scorer, with
the task's answers (`accuracy`). Forwards of HF methods are counted with a forward hook on the model, so their TPF
is measured, not assumed. HF methods cannot separate prefill from decoding; theirs is reported as null, and TPS is
end to end (prefill included) for every method. Ratios are computed here, from numbers taken in this run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import DecodeOutput, finish
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
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


class ForwardCounter:
    """Counts `model.forward` calls (one per decoding step of HF generate, prefill included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def hf_generate_decoder(model, eos_token_id, pad_token_id, max_new_tokens: int, **generate_kwargs) -> Decoder:
    """HF `generate` wrapped to the project's decoder interface; one call per prompt when batched generation is
    not supported by the method (prompt lookup), else left-padded batches."""

    def run_one(prompt: list[int]) -> tuple[list[int], int]:
        ids = torch.tensor([prompt], device=model.device)
        counter = ForwardCounter(model)
        try:
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
                **generate_kwargs,
            )
        finally:
            counter.close()
        return out[0, len(prompt) :].tolist(), counter.count

    def decode(prompts: list[list[int]]) -> DecodeOutput:
        timer = Timer(model.device)
        start = timer.now()
        seqs, stats = [], []
        for p in prompts:
            tokens, forwards = run_one(p)
            tokens, _ = finish(tokens, eos_token_id, max_new_tokens)
            seqs.append(tokens)
            stats.append(SequenceStats(new_tokens=len(tokens), forwards=forwards))
        return DecodeOutput(seqs, DecodeStats(stats, decode_seconds=timer.now() - start, prefill_timed=False))

    return decode


def standard_methods(
    model,
    *,
    eos_token_id: int,
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
    methods["hf_prompt_lookup"] = hf_generate_decoder(
        model, eos_token_id, pad_token_id, max_new_tokens, prompt_lookup_num_tokens=prompt_lookup_tokens
    )
    return methods


def jf_methods(
    jf_model,
    *,
    eos_token_id: int,
    pad_token_id: int,
    max_new_tokens: int,
    block_size: int,
    tuned: JacobiConfig | None = None,
) -> tuple[dict[str, Decoder], dict[str, str]]:
    """The Jacobi Forcing model's methods (vanilla Jacobi, + recycling, + multi-block, + both, the autotuned
    config) and its own greedy AR, which they must reproduce token for token; returns (methods, same_output_as)."""
    from jf_core.decoding.config_io import decode
    from jf_core.decoding.multiblock import JFDecodeConfig

    n = block_size
    configs: dict[str, JacobiConfig] = {
        f"jf_jacobi_n{n}": JacobiConfig(block_size=n, max_new_tokens=max_new_tokens),
        "jf_recycling": JFDecodeConfig(
            block_size=n, num_blocks=1, pool_size=4, seed_drafts=True, max_new_tokens=max_new_tokens
        ),
        "jf_multiblock": JFDecodeConfig(block_size=n, num_blocks=2, pool_size=0, max_new_tokens=max_new_tokens),
        "jf_recycling_multiblock": JFDecodeConfig(block_size=n, seed_drafts=True, max_new_tokens=max_new_tokens),
    }
    if tuned is not None:
        from dataclasses import replace

        configs["jf_autotuned"] = replace(tuned, max_new_tokens=max_new_tokens)
    methods: dict[str, Decoder] = {
        "jf_ar": lambda ps: ar_decode(
            jf_model, ps, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
    }
    for name, cfg in configs.items():
        methods[name] = lambda ps, cfg=cfg: decode(
            jf_model, ps, cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
    return methods, {name: "jf_ar" for name in methods}


def _batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[list[int]]]:
    return [[list(p) for p in prompts[i : i + batch_size]] for i in range(0, len(prompts), batch_size)]


def _concat(outs: Sequence[DecodeOutput]) -> DecodeOutput:
    """Outputs of consecutive batches as one: sequences in order, statistics merged."""
    stats = DecodeStats(sequences=[])
    for out in outs:
        stats = stats.merge(out.stats)
    return DecodeOutput([seq for out in outs for seq in out.sequences], stats)


def decode_batched(decoder: Decoder, prompts: Sequence[Sequence[int]], batch_size: int) -> DecodeOutput:
    """`decoder` over `prompts` in batches of `batch_size`: outputs in order, statistics merged."""
    return _concat([decoder(batch) for batch in _batches(prompts, batch_size)])


def run_interleaved(
    decoders: dict[str, Decoder],
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    *,
    repeats: int = 1,
    warmup_prompts: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, DecodeOutput]:
    """Every decoder over `prompts`, taking turns batch by batch; with `repeats`, each batch runs that many times
    per decoder and its fastest run counts.

    On a shared or boosting CPU the speed of the machine drifts over seconds (turbo budgets run out, neighbours
    wake up). Running method after method lets that drift decide a comparison; taking turns on each batch exposes
    every method to the same machine, and keeping each batch's fastest run drops the spikes."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    batches = _batches(prompts, batch_size)
    for decoder in decoders.values():  # warm every code path before anything is timed
        decode_batched(decoder, prompts[:warmup_prompts], batch_size)
    best: dict[str, list[DecodeOutput | None]] = {name: [None] * len(batches) for name in decoders}
    for rep in range(repeats):
        if progress:
            progress(f"run {rep + 1}/{repeats}: {len(decoders)} methods taking turns on {len(batches)} batches")
        for b, batch in enumerate(batches):
            for name, decoder in decoders.items():
                out = decoder(batch)
                kept = best[name][b]
                if kept is None or out.stats.seconds < kept.stats.seconds:
                    best[name][b] = out
    return {name: _concat(outs) for name, outs in best.items()}


def bench(
    methods: dict[str, Decoder],
    prompts: list[list[int]],
    *,
    batch_size: int = 1,
    warmup_prompts: int = 2,
    repeats: int = 1,
    scorer: Scorer | None = None,
    reference: str = "hf_generate",
    baseline_ar: str = "ar",
    progress: Callable[[str], None] | None = None,
    same_output_as: dict[str, str] | None = None,
) -> list[MethodResult]:
    """Speedups are against `reference` and `baseline_ar` (the base model's HF generate and our AR);
    `identical_fraction` compares each method with `same_output_as[method]` (default: `reference`), e.g. a
    fine-tuned model's methods with that model's own greedy AR. Timing: `run_interleaved`."""
    if reference not in methods:
        raise ValueError(f"the reference method {reference!r} is not among {sorted(methods)}")
    same_output_as = same_output_as or {}
    outputs = run_interleaved(
        methods, prompts, batch_size, repeats=repeats, warmup_prompts=warmup_prompts, progress=progress
    )
    ref = outputs[reference]
    results = []
    for name, out in outputs.items():
        s = out.stats
        twin = outputs[same_output_as.get(name, reference)]
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
                speedup_vs_hf_generate=s.tps / ref.stats.tps,
                speedup_vs_ar=s.tps / outputs[baseline_ar].stats.tps if baseline_ar in outputs else math.nan,
                identical_fraction=sum(a == b for a, b in zip(out.sequences, twin.sequences, strict=False))
                / len(prompts),
                accuracy=None
                if scorer is None
                else sum(scorer(i, seq) for i, seq in enumerate(out.sequences)) / len(prompts),
                tpf_per_example=[q.tpf for q in s.sequences],
                accepted_histogram=s.accepted_histogram(),
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


def save_plots(results: list[MethodResult], out_dir: Path) -> list[Path]:
    """TPF and TPS per method, and the accepted-tokens-per-forward histogram of every multi-token method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    names = [r.method for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, values, label in ((axes[0], [r.tpf for r in results], "TPF"), (axes[1], [r.tps for r in results], "TPS")):
        ax.bar(range(len(names)), values)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"{label} per method")
    fig.tight_layout()
    paths = [out_dir / "tpf_tps_per_method.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r.accepted_histogram and max(r.accepted_histogram) > 1:
            total = sum(r.accepted_histogram.values())
            ks = sorted(r.accepted_histogram)
            ax.plot(ks, [r.accepted_histogram[k] / total for k in ks], marker=".", label=r.method)
    ax.set_xlabel("tokens accepted in one forward")
    ax.set_ylabel("share of forwards")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "accepted_histogram.png")
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def write_json(results: list[MethodResult], path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "methods": {r.method: asdict(r) for r in results}}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
