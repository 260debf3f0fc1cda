"""What a decoding call measured, with one definition of each number for every decoder.

Definitions (docs/decoding.md, "Metrics", repeats them):
- forward: one call of the model. The prefill forward counts; it yields the first new token.
- new tokens: tokens generated per sequence up to and including EOS (or up to max_new_tokens).
- TPF (tokens per forward) = new tokens / forwards that sequence took part in, prefill included, so greedy AR
  scores exactly 1.0 and a decoder that accepts k tokens per forward approaches k.
  Over a batch, TPF = total new tokens / total per-sequence forwards.
- TPS (tokens per second) = total new tokens / (prefill + decode wall time), end to end; `decode_tps` excludes
  prefill. Times are taken after a device synchronise, so they measure finished work.
- accepted per forward: for each decode forward of each sequence, how many tokens it committed (>= 1).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch


@dataclass
class SequenceStats:
    new_tokens: int = 0
    forwards: int = 1  # the prefill
    accepted: list[int] = field(default_factory=list)

    @property
    def tpf(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0


@dataclass
class DecodeStats:
    sequences: list[SequenceStats]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    batch_forwards: int = 0  # model calls after prefill, however many rows each carried
    prefill_timed: bool = True  # False for decoders (HF generate) whose prefill time is inside decode_seconds
    # Sequences our AR decoded (ar.py), whatever was asked: a dispatch that sent a batch to AR says so here, where a
    # TPF of 1.0 would also fit a Jacobi decoder that accepted nothing.
    ar_sequences: int = 0
    # Each batch's seconds, where these stats merge several (common.py `concat_outputs`): a comparison of two
    # decoders batch by batch (evaluation/speed.py `ratio_interval`) needs them apart.
    batch_seconds: list[float] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return sum(s.new_tokens for s in self.sequences)

    @property
    def forwards(self) -> int:
        return sum(s.forwards for s in self.sequences)

    @property
    def tpf(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tps(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tps(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def ar_share(self) -> float:
        """The fraction of the sequences our AR decoded (1.0: every batch went to AR)."""
        return self.ar_sequences / len(self.sequences) if self.sequences else 0.0

    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(k for s in self.sequences for k in s.accepted).items()))

    def merge(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(
            sequences=self.sequences + other.sequences,
            prefill_seconds=self.prefill_seconds + other.prefill_seconds,
            decode_seconds=self.decode_seconds + other.decode_seconds,
            batch_forwards=self.batch_forwards + other.batch_forwards,
            prefill_timed=self.prefill_timed and other.prefill_timed,
            ar_sequences=self.ar_sequences + other.ar_sequences,
            batch_seconds=self.batches() + other.batches(),
        )

    def batches(self) -> list[float]:
        """Each batch's seconds: those merged here, or these stats' own as one batch (none before any sequence)."""
        return list(self.batch_seconds) or ([self.seconds] if self.sequences else [])

    def summary(self) -> dict[str, float]:
        return {
            "new_tokens": float(self.new_tokens),
            "forwards": float(self.forwards),
            "tpf": self.tpf,
            "tps": self.tps,
            "decode_tps": self.decode_tps,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
        }


class Timer:
    """Wall-clock time of finished device work: synchronises CUDA before reading the clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
