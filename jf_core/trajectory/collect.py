"""Collect Jacobi trajectories with the decoding engine's recorder: one record per prompt x converged block; or,
with `kind: synthetic` or `text`, the cheaper synthetic ones (synthetic.py) in the same records.

There is no second copy of the Jacobi step: the recorder sees exactly what `JacobiDecoder` iterates. Generation
runs to EOS or to `max_new_tokens` rounded up to a whole number of blocks, so every block but one ending at EOS
is n tokens long.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import torch

from jf_core.decoding import JacobiConfig
from jf_core.decoding.draft import DraftInitName
from jf_core.decoding.jacobi import BlockStates, JacobiDecoder
from jf_core.models import stop_tokens
from jf_core.trajectory.prompts import PromptItem
from jf_core.trajectory.synthetic import Corruption, synthesize


@dataclass(frozen=True)
class CollectConfig:
    block_size: int = 16
    max_new_tokens: int = 256
    seed: int = 0
    batch_size: int = 16
    draft_init: DraftInitName = "prompt_sample"
    round_id: str = "round-0"
    # synthetic: greedy AR + corrupted tails (synthetic.py); text: the prompts' reference answers + corrupted tails
    kind: Literal["jacobi", "synthetic", "text"] = "jacobi"
    corruption: Corruption = "context"  # synthetic only: what replaces a state's tail

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        JacobiConfig(block_size=self.block_size, max_new_tokens=self.max_new_tokens)  # same checks

    def jacobi(self) -> JacobiConfig:
        whole_blocks = math.ceil(self.max_new_tokens / self.block_size) * self.block_size
        return JacobiConfig(
            block_size=self.block_size, max_new_tokens=whole_blocks, draft_init=self.draft_init, seed=self.seed
        )


@dataclass
class CollectResult:
    records: list[dict]
    new_tokens: int
    seconds: float


def collect(
    model: torch.nn.Module, tokenizer, prompts: list[PromptItem], cfg: CollectConfig, *, model_hash: str
) -> CollectResult:
    start = time.perf_counter()
    if cfg.kind in ("synthetic", "text"):
        records, new_tokens = synthesize(model, tokenizer, prompts, cfg, model_hash=model_hash)
        return CollectResult(records=records, new_tokens=new_tokens, seconds=time.perf_counter() - start)
    jacobi = cfg.jacobi()
    records: list[dict] = []
    new_tokens = 0
    for first in range(0, len(prompts), cfg.batch_size):
        batch = prompts[first : first + cfg.batch_size]
        recorder = BlockStates()
        decoder = JacobiDecoder(model, jacobi, stop=stop_tokens(model, tokenizer), recorder=recorder)
        out = decoder.decode([p.token_ids for p in batch])
        new_tokens += out.stats.new_tokens
        for (sequence, block), (fixed_point, length) in sorted(recorder.fixed.items()):
            states = recorder.states[(sequence, block)]
            records.append(
                {
                    "prompt_id": batch[sequence].prompt_id,
                    "round_id": cfg.round_id,
                    "block_index": block,
                    "n": cfg.block_size,
                    "prompt_ids": batch[sequence].token_ids,
                    "states": states,
                    "fixed_point": fixed_point,
                    "length": length,
                    "iterations": len(states) - 1,
                    "model_hash": model_hash,
                    "seed": cfg.seed,
                    "kind": "jacobi",
                }
            )
    return CollectResult(records=records, new_tokens=new_tokens, seconds=time.perf_counter() - start)
