"""Noise schedules: which draft state of each block becomes its noisy copy.

A state's noise ratio is the fraction of the block from its first unconverged position to the end (0: the fixed
point itself, 1: wrong from the first token). Each block j gets a target ratio; the noisy block is the state whose
ratio is closest to it (ties: the earliest state, i.e. the noisier one).

- progressive: within a window of w blocks the target rises linearly from min to max, then the window repeats
  (easy to hard, cyclically), the paper's choice;
- reverse: the same window falling from max to min (the paper's worst ablation);
- random: a seeded uniform pick from the same w levels.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ScheduleName = Literal["progressive", "reverse", "random"]


@dataclass(frozen=True)
class NoiseSchedule:
    kind: ScheduleName = "progressive"
    window: int = 16
    min_ratio: float = 0.0
    max_ratio: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"noise window must be >= 1, got {self.window}")
        if not 0.0 <= self.min_ratio <= self.max_ratio <= 1.0:
            raise ValueError(f"need 0 <= min_ratio <= max_ratio <= 1, got {self.min_ratio}, {self.max_ratio}")
        if self.kind not in ("progressive", "reverse", "random"):
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
        # Seeded by (seed, prompt, block): reproducible, and independent of the order records are read in.
        return random.Random(f"{self.seed}:{prompt_id}:{block_index}").choice(levels)


def noise_ratio(state: Sequence[int], fixed_point: Sequence[int], length: int) -> float:
    """Fraction of the block from the first position (within its valid length) where `state` differs."""
    n = len(fixed_point)
    first = next((i for i in range(length) if state[i] != fixed_point[i]), n)
    return (n - first) / n if first < length else 0.0


def pick_noisy_state(states: Sequence[Sequence[int]], fixed_point: Sequence[int], length: int, target: float) -> int:
    ratios = [noise_ratio(s, fixed_point, length) for s in states]
    return min(range(len(states)), key=lambda i: (abs(ratios[i] - target), i))
