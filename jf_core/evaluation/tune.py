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
from jf_core.decoding import JacobiConfig, JFDecodeConfig, StopTokens, ar_decode, decode
from jf_core.draft_adapter.adapter import draft_adapter
from jf_core.evaluation.speed import run_interleaved, whole_batches
from jf_core.model_dir import Crossover, ServingPrior


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

    def configs(self, max_new_tokens: int, adapter: bool = False) -> list[JFDecodeConfig]:
        """Every distinct config of the grid, in its order; `adapter`: the model drafts with a draft adapter, so its
        chain's span is a knob."""
        out: list[JFDecodeConfig] = []
        for values in itertools.product(*self.grid.values()):
            knobs = dict(zip(self.grid, values, strict=True))
            cfg = JFDecodeConfig(**knobs, max_new_tokens=max_new_tokens).canonical(adapter)
            if cfg not in out:
                out.append(cfg)
        return out

    def for_model(self, model: torch.nn.Module, max_new_tokens: int) -> list[JFDecodeConfig]:
        """The grid `model` gets: with a draft adapter, its chain's span too."""
        return self.configs(max_new_tokens, adapter=draft_adapter(model) is not None)


@dataclass
class TuneTrial:
    config: JFDecodeConfig
    tps: float
    tpf: float


def tune(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    stop: StopTokens,
    max_new_tokens: int,
    space: TuneSpace | None = None,
    batch_size: int = 1,
    repeats: int = 1,
    progress: Callable[[int, int, TuneTrial], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[JFDecodeConfig, list[TuneTrial]]:
    """`progress(i, total, trial)` for each configuration once all are measured; `say(line)` while they run (the
    configurations take turns batch by batch, so no trial is done before the last batch is)."""
    configs = (space or TuneSpace.of()).for_model(model, max_new_tokens)
    if not configs:
        raise ValueError("the tuning space is empty")
    decoders = {str(i): lambda ps, cfg=cfg: decode(model, ps, cfg, stop=stop) for i, cfg in enumerate(configs)}
    outputs = run_interleaved(decoders, prompts, batch_size, repeats=repeats, progress=say)
    trials = []
    for i, cfg in enumerate(configs):
        stats = outputs[str(i)].stats
        trials.append(TuneTrial(cfg, stats.tps, stats.tpf))
        if progress is not None:
            progress(i + 1, len(configs), trials[-1])
    best = max(range(len(trials)), key=lambda i: trials[i].tps)
    return configs[best], trials


def measure_crossover(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    stop: StopTokens,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    repeats: int = 1,
    progress: Callable[[int, float, float], None] | None = None,
) -> Crossover:
    """AR and `config` taking turns at each batch size on the same prompts (cycled to fill the largest batch):
    Jacobi's TPS over AR's and its TPF per batch size. A forward's cost grows with batch x width once the device is
    busy, so the speedup falls with the batch size; where it drops below 1 a server should run AR."""
    if not batch_sizes:
        raise ValueError("no batch sizes to measure the crossover at")
    decoders = {
        "ar": lambda ps: ar_decode(model, ps, max_new_tokens=config.max_new_tokens, stop=stop),
        "jacobi": lambda ps: decode(model, ps, config, stop=stop),
    }
    sizes, speedups, tpfs = [], [], []
    for size in sorted(set(batch_sizes)):
        pool = whole_batches(prompts, size)
        out = run_interleaved(decoders, pool, size, repeats=repeats, warmup_prompts=min(size, 2))
        ar, jf = out["ar"].stats, out["jacobi"].stats
        sizes.append(size)
        speedups.append(round(jf.tps / ar.tps, 4) if ar.tps else 0.0)
        tpfs.append(round(jf.tpf, 4))
        if progress is not None:
            progress(size, speedups[-1], tpfs[-1])
    return Crossover(sizes, speedups, tpfs)


def store_crossover(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    model_dir,
    batch_sizes: Sequence[int],
    *,
    repeats: int = 1,
    progress: Callable[[int, float, float], None] | None = None,
) -> ServingPrior | None:
    """`measure_crossover`, stored in the model's jacobi_forcing block with the hardware and dtype it was measured
    on (None when `batch_sizes` is empty)."""
    from jf_core.model_dir import update_block
    from jf_core.models import stop_tokens

    if not batch_sizes:
        return None
    found = measure_crossover(
        model,
        prompts,
        config,
        stop=stop_tokens(model, tokenizer),
        batch_sizes=batch_sizes,
        repeats=repeats,
        progress=progress,
    )
    weights = next(model.parameters())
    prior = ServingPrior.measured(found, weights.device, str(weights.dtype).removeprefix("torch."))
    update_block(model_dir, **prior.block())
    return prior
