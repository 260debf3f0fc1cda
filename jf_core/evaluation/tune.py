"""Autotune: the decode config (n, K, pool_size, r, seeded drafts, adaptive width, prompt lookup, a draft adapter's
chain: whatever fields the profile's grid names) with the best TPS on this hardware, on calibration prompts.

Every candidate decodes the same prompts at the same batch size after a warmup, the candidates taking turns batch
by batch (`speed.run_interleaved`: a drifting CPU must not pick the winner); TPF is reported beside TPS. The
search is a grid (small by default: the space is small and every point is a real measurement), and because every
candidate is lossless, speed is the only thing compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from jf_core.config import TuneConfig
from jf_core.decoding import DecodeOutput, JacobiConfig, JFDecodeConfig, StopTokens, ar_decode, decode
from jf_core.decoding.common import concat_outputs
from jf_core.decoding.proposers.suffix import draft_corpus
from jf_core.draft_adapter.adapter import draft_adapter
from jf_core.evaluation.speed import WARMUP_PROMPTS, run_interleaved, whole_batches
from jf_core.model_dir import Crossover


@dataclass(frozen=True)
class TuneSpace:
    """The grid `tune` searches: a profile's `evaluation.tune.grid` (jf_core/config.py TuneConfig), each decode config
    field named as JFDecodeConfig names it, to the values tried."""

    grid: dict[str, tuple]

    @classmethod
    def of(cls, cfg: TuneConfig | None = None, **grid: Sequence) -> TuneSpace:
        """The search space a profile's `evaluation.tune` names (default: TuneConfig's), the fields in `grid`
        replacing or joining its own."""
        merged = TuneConfig.model_validate({"grid": {**(cfg or TuneConfig()).grid, **grid}}).grid
        return cls({name: tuple(values) for name, values in merged.items()})

    def configs(self, max_new_tokens: int, adapter: bool = False, corpus: bool = False) -> list[JFDecodeConfig]:
        """Every distinct config of the grid, in its order; `adapter`: the model drafts with a draft adapter, so its
        chain's span is a knob; `corpus`: it keeps a draft corpus, so suffix drafts are."""
        out: list[JFDecodeConfig] = []
        for values in itertools.product(*self.grid.values()):
            knobs = dict(zip(self.grid, values, strict=True))
            cfg = JFDecodeConfig(**knobs, max_new_tokens=max_new_tokens).canonical(adapter, corpus)
            if cfg not in out:
                out.append(cfg)
        return out

    def for_model(self, model: torch.nn.Module, max_new_tokens: int) -> list[JFDecodeConfig]:
        """The grid `model` gets: with a draft adapter, its chain's span too; with a draft corpus, suffix drafts."""
        return self.configs(
            max_new_tokens, adapter=draft_adapter(model) is not None, corpus=draft_corpus(model) is not None
        )


@dataclass
class TuneTrial:
    config: JFDecodeConfig
    tps: float
    tpf: float
    prompts: int | None = None  # the calibration prompts it decoded (fewer: stopped at a rung of the halving)


def tune(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    stop: StopTokens,
    max_new_tokens: int,
    space: TuneSpace | None = None,
    batch_size: int = 1,
    repeats: int = 1,
    rungs: int = 1,
    progress: Callable[[int, int, TuneTrial], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[JFDecodeConfig, list[TuneTrial]]:
    """`progress(i, total, trial)` for each configuration once all are measured; `say(line)` while they run (the
    configurations take turns batch by batch, so no trial is done before the last batch is).

    `rungs` > 1: successive halving. The prompts are cut into that many slices (whole batches); every configuration
    still running decodes the next slice, taking turns, and after each slice but the last the slower half (by
    tokens/s over every prompt they have decoded, the same prompts for all) stops. Most of a grid is far from the
    winner, so this keeps the winner's measurement on every prompt at about half the grid's cost (16 configurations
    in 3 rungs: 112 configuration-slices of prompts instead of 192)."""
    configs = (space or TuneSpace.of()).for_model(model, max_new_tokens)
    if not configs:
        raise ValueError("the tuning space is empty")
    if rungs < 1:
        raise ValueError(f"rungs must be >= 1, got {rungs}")
    slices = _slices(prompts, batch_size, rungs)
    running = list(range(len(configs)))
    outs: dict[int, list[DecodeOutput]] = {i: [] for i in running}
    for r, part in enumerate(slices):
        decoders = {i: lambda ps, cfg=configs[i]: decode(model, ps, cfg, stop=stop) for i in running}
        rung = f"rung {r + 1}/{len(slices)}: {len(running)} configs, " if len(slices) > 1 else ""
        lines = (lambda line, rung=rung: say(rung + line)) if say else None
        warm = WARMUP_PROMPTS if r == 0 else 0  # warm once: a configuration's code paths stay warm between rungs
        measured = run_interleaved(decoders, part, batch_size, repeats=repeats, warmup_prompts=warm, progress=lines)
        for i, out in measured.items():
            outs[i].append(out)
        if r < len(slices) - 1:
            running = sorted(running, key=lambda i: -concat_outputs(outs[i]).stats.tps)[: max(1, len(running) // 2)]
    trials = []
    for i, cfg in enumerate(configs):
        stats = concat_outputs(outs[i]).stats
        trials.append(TuneTrial(cfg, stats.tps, stats.tpf, len(stats.sequences)))
        if progress is not None:
            progress(i + 1, len(configs), trials[-1])
    best = max(running, key=lambda i: trials[i].tps)  # among those that decoded every prompt
    return configs[best], trials


def _slices(prompts: Sequence[Sequence[int]], batch_size: int, rungs: int) -> list[Sequence[Sequence[int]]]:
    """`prompts` cut into at most `rungs` consecutive slices of whole batches, as even as the batches allow."""
    batches = max(1, -(-len(prompts) // batch_size))
    rungs = min(rungs, batches)
    cuts = [round(k * batches / rungs) * batch_size for k in range(rungs + 1)]
    return [prompts[a:b] for a, b in itertools.pairwise(cuts) if prompts[a:b]]


def measure_crossover(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    stop: StopTokens,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    repeats: int = 1,
    min_seconds: float = 0.0,
    progress: Callable[[int, float, float], None] | None = None,
) -> Crossover:
    """AR and `config` taking turns at each batch size on the same prompts (cycled to fill the largest batch):
    Jacobi's TPS over AR's and its TPF per batch size. A forward's cost grows with batch x width once the device is
    busy, so the speedup falls with the batch size; where it drops below 1 a server should run AR. The calibration
    prompts fill one batch or two at the larger sizes: `min_seconds` times them more often (`run_interleaved`)."""
    if not batch_sizes:
        raise ValueError("no batch sizes to measure the crossover at")
    decoders = {
        "ar": lambda ps: ar_decode(model, ps, max_new_tokens=config.max_new_tokens, stop=stop),
        "jacobi": lambda ps: decode(model, ps, config, stop=stop),
    }
    sizes, speedups, tpfs = [], [], []
    for size in sorted(set(batch_sizes)):
        pool = whole_batches(prompts, size)
        out = run_interleaved(
            decoders, pool, size, repeats=repeats, warmup_prompts=min(size, 2), min_seconds=min_seconds
        )
        ar, jf = out["ar"].stats, out["jacobi"].stats
        sizes.append(size)
        speedups.append(round(jf.tps / ar.tps, 4) if ar.tps else 0.0)
        tpfs.append(round(jf.tpf, 4))
        if progress is not None:
            progress(size, speedups[-1], tpfs[-1])
    return Crossover(sizes, speedups, tpfs)
