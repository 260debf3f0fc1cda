"""Autotune: the decode config (n, K, pool_size, r, seeded drafts) with the best TPS on this hardware, on
calibration prompts.

Every candidate decodes the same prompts at the same batch size after a warmup, the candidates taking turns batch
by batch (`speed.run_interleaved`: a drifting CPU must not pick the winner); TPF is reported beside TPS. The
search is a grid (small by default: the space is small and every point is a real measurement), and because every
candidate is lossless, speed is the only thing compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from jf_core.decoding.common import EosIds
from jf_core.decoding.config_io import decode
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.evaluation.speed import run_interleaved


@dataclass(frozen=True)
class TuneSpace:
    block_sizes: tuple[int, ...] = (16, 32, 64)
    num_blocks: tuple[int, ...] = (1, 2, 3)
    pool_sizes: tuple[int, ...] = (0, 2, 4)
    spawn_ratios: tuple[float, ...] = (0.5, 0.85)
    ngrams: tuple[int, ...] = (0,)  # recycled candidate length; 0 = n - 1
    seed_drafts: tuple[bool, ...] = (False, True)

    def configs(self, max_new_tokens: int) -> list[JFDecodeConfig]:
        out = []
        grid = itertools.product(
            self.block_sizes, self.num_blocks, self.pool_sizes, self.spawn_ratios, self.ngrams, self.seed_drafts
        )
        for n, k, pool, r, ngram, seed in grid:
            if (k == 1 and r != self.spawn_ratios[0]) or (pool == 0 and ngram != self.ngrams[0]):
                continue  # r only matters with more than one block, the n-gram length only with recycling
            cfg = JFDecodeConfig(
                block_size=n,
                num_blocks=k,
                pool_size=pool,
                spawn_ratio=r,
                ngram=ngram,
                seed_drafts=seed,
                max_new_tokens=max_new_tokens,
            )
            out.append(cfg)
        return out


@dataclass
class TuneTrial:
    config: dict
    tps: float
    tpf: float


def tune(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    eos_token_id: EosIds,
    pad_token_id: int,
    max_new_tokens: int,
    space: TuneSpace = TuneSpace(),
    batch_size: int = 1,
    repeats: int = 1,
    progress: Callable[[int, int, TuneTrial], None] | None = None,
) -> tuple[JFDecodeConfig, list[TuneTrial]]:
    configs = space.configs(max_new_tokens)
    if not configs:
        raise ValueError("the tuning space is empty")
    decoders = {
        str(i): lambda ps, cfg=cfg: decode(model, ps, cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        for i, cfg in enumerate(configs)
    }
    outputs = run_interleaved(decoders, prompts, batch_size, repeats=repeats)
    trials = []
    for i, cfg in enumerate(configs):
        stats = outputs[str(i)].stats
        trials.append(TuneTrial(asdict(cfg), stats.tps, stats.tpf))
        if progress is not None:
            progress(i + 1, len(configs), trials[-1])
    best = max(range(len(trials)), key=lambda i: trials[i].tps)
    return configs[best], trials
