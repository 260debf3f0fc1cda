"""Noise schedules: which draft state of each block becomes its noisy copy.

A state's noise ratio is the fraction of the block from its first unconverged position to the end (0: the fixed
point itself, 1: wrong from the first token). Each block j gets a target ratio; the noisy block is the state whose
ratio is closest to it (ties: the earliest state, i.e. the noisier one).

- progressive: within a window of w blocks the target rises linearly from min to max, then the window repeats
  (easy to hard, cyclically), the paper's choice;
- reverse: the same window falling from max to min (the paper's worst ablation);
- progressive_phase: progressive, but each answer enters the window at a seeded random level, so every level meets
  every block position (plain progressive ties level k to block k mod w: block 0 of every answer is always clean);
- random: a seeded uniform pick from the same w levels;
- uniform_state: no target ratio at all: a seeded uniform pick among the block's recorded Jacobi states that are not
  its fixed point (CLLM's sampling of an intermediate state; `training.method: cllm`).

`ratio_profile` measures what a schedule actually produces on a set of trajectories: the target and picked ratios
and the blocks per answer. A progressive window of w levels only climbs past level k in answers longer than k
blocks, so on short answers it never reaches its noisy half (`jf ablate` logs this beside each variant).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from jf_core.training.config import JFTrainConfig, WindowSchedule

# The window's schedules (training.schedule), and CLLM's, which has none (training.method).
ScheduleName = Literal[WindowSchedule, "uniform_state"]


@dataclass(frozen=True)
class NoiseSchedule:
    kind: ScheduleName = "progressive"
    window: int = 16
    min_ratio: float = 0.0
    max_ratio: float = 1.0
    seed: int = 0

    @classmethod
    def of(cls, t: JFTrainConfig) -> NoiseSchedule:
        """The profile's training section's schedule: its window for Jacobi Forcing, CLLM's uniform state pick."""
        return cls(t.noise_kind, window=t.window, min_ratio=t.min_ratio, max_ratio=t.max_ratio, seed=t.seed)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"noise window must be >= 1, got {self.window}")
        if not 0.0 <= self.min_ratio <= self.max_ratio <= 1.0:
            raise ValueError(f"need 0 <= min_ratio <= max_ratio <= 1, got {self.min_ratio}, {self.max_ratio}")
        if self.kind not in get_args(ScheduleName):
            raise ValueError(f"unknown noise schedule {self.kind!r}")

    def levels(self) -> list[float]:
        if self.window == 1:
            return [self.max_ratio]
        step = (self.max_ratio - self.min_ratio) / (self.window - 1)
        return [self.min_ratio + i * step for i in range(self.window)]

    def target(self, block_index: int, prompt_id: str = "") -> float:
        levels = self.levels()
        if self.kind == "progressive":
            return levels[block_index % self.window]
        if self.kind == "reverse":
            return levels[::-1][block_index % self.window]
        if self.kind == "progressive_phase":
            phase = random.Random(f"{self.seed}:{prompt_id}:phase").randrange(self.window)
            return levels[(block_index + phase) % self.window]
        if self.kind == "uniform_state":
            raise ValueError("the uniform_state schedule has no target ratio: it picks a state (`pick`)")
        # Seeded by (seed, prompt, block): reproducible, and independent of the order records are read in.
        return random.Random(f"{self.seed}:{prompt_id}:{block_index}").choice(levels)

    def pick(
        self, states: Sequence[Sequence[int]], fixed_point: Sequence[int], length: int, block_index: int, prompt_id: str
    ) -> int:
        """The index of the state that becomes block `block_index`'s noisy copy."""
        if self.kind != "uniform_state":
            return pick_noisy_state(states, fixed_point, length, self.target(block_index, prompt_id))
        drafts = [i for i, s in enumerate(states) if noise_ratio(s, fixed_point, length) > 0]
        if not drafts:  # converged on the first forward: only the fixed point, which teaches no consistency
            return len(states) - 1
        return random.Random(f"{self.seed}:{prompt_id}:{block_index}").choice(drafts)


def noise_ratio(state: Sequence[int], fixed_point: Sequence[int], length: int) -> float:
    """Fraction of the block from the first position (within its valid length) where `state` differs."""
    n = len(fixed_point)
    first = next((i for i in range(length) if state[i] != fixed_point[i]), n)
    return (n - first) / n if first < length else 0.0


def pick_noisy_state(states: Sequence[Sequence[int]], fixed_point: Sequence[int], length: int, target: float) -> int:
    ratios = [noise_ratio(s, fixed_point, length) for s in states]
    return min(range(len(states)), key=lambda i: (abs(ratios[i] - target), i))


class BlocksPerAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: float
    p10: int
    p50: int
    p90: int


class NoiseProfile(BaseModel):
    """What a noise schedule makes of a set of trajectories (`ratio_profile`): the packing stage's record of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks_per_answer: BlocksPerAnswer
    target_mean: float | None  # None for uniform_state: it has no target ratio
    picked_mean: float
    picked_above_half: float  # the share of blocks whose noisy copy is wrong past its middle
    picked_histogram: list[int]


def ratio_profile(records: Sequence[dict], schedule: NoiseSchedule, bins: int = 10) -> NoiseProfile:
    """What `schedule` does to these trajectory records (one per block): blocks per answer (mean and quantiles), the
    mean target ratio (None for uniform_state) and picked ratio, the fraction of blocks whose noisy copy is wrong
    past its middle (ratio > 0.5), and a histogram of picked ratios over `bins` equal bins of [0, 1]."""
    per_answer: dict[str, int] = {}
    targets, picked = [], []
    for r in records:
        per_answer[r["prompt_id"]] = max(per_answer.get(r["prompt_id"], 0), r["block_index"] + 1)
        i = schedule.pick(r["states"], r["fixed_point"], r["length"], r["block_index"], r["prompt_id"])
        picked.append(noise_ratio(r["states"][i], r["fixed_point"], r["length"]))
        if schedule.kind != "uniform_state":
            targets.append(schedule.target(r["block_index"], r["prompt_id"]))
    counts = sorted(per_answer.values())
    histogram = [0] * bins
    for ratio in picked:
        histogram[min(bins - 1, int(ratio * bins))] += 1

    def quantile(q: float) -> int:
        return counts[min(len(counts) - 1, int(q * len(counts)))] if counts else 0

    return NoiseProfile(
        blocks_per_answer=BlocksPerAnswer(
            mean=sum(counts) / max(1, len(counts)), p10=quantile(0.1), p50=quantile(0.5), p90=quantile(0.9)
        ),
        target_mean=sum(targets) / len(targets) if targets else None,
        picked_mean=sum(picked) / max(1, len(picked)),
        picked_above_half=sum(r > 0.5 for r in picked) / max(1, len(picked)),
        picked_histogram=histogram,
    )
