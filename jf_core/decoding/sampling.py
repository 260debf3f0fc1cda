"""Lossless sampling: temperature, top-k and top-p for every decoder, exact in distribution.

Sampling is made a deterministic function of the logits and of noise fixed in advance: the token at output position
t of a request is `argmax(filtered(logits / T) + G[seed, t])`, where `G[seed, t]` is a vector of Gumbel noise over
the vocabulary drawn by a counter-based generator keyed by (the request's seed, t) (the Gumbel-max trick: the argmax
is a draw from softmax of the filtered logits). Given the noise, the next token is a function of the prefix, exactly
as in greedy decoding, so everything that makes Jacobi decoding lossless carries over unchanged: the Jacobi fixed
point is the AR sample drawn with the same noise, a draft token is accepted only when it equals that sample, and
multi-block and recycling verify against it. The same seed gives the same text whatever decoder, block size or batch
serves the request.

The generator is a 32-bit integer hash (Wellons' lowbias32) of (seed, position, token id) computed with torch ops,
so the noise is the same on every device, needs no state, and a position revisited by later Jacobi iterations gets
the same noise again. Filters follow Hugging Face's order and rules (temperature, then top-k, then top-p keeping
the smallest set whose probability reaches p, at least one token), so the distribution is HF's `do_sample=True`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no top-p filter

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {self.temperature} (0 means greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def of(cls, temperature: float | None, top_k: int | None = None, top_p: float | None = None) -> Sampling | None:
        """What callers pass (CLI flags, request bodies, model params): temperature 0 or absent means greedy (None);
        absent filters mean none."""
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature} (0 means greedy)")
        if not temperature:
            return None
        return cls(float(temperature), top_k=int(top_k or 0), top_p=1.0 if top_p is None else float(top_p))


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit values. A product may wrap past int64; its low 32 bits, all that
    is kept, are right either way, and every shift happens on a masked (non-negative) value."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def vocab_keys(vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """The per-token half of the noise key, [V]: fixed for a vocabulary, so samplers compute it once."""
    return _mix(torch.arange(vocab_size, device=device, dtype=torch.long) + 0x9E3779B9)


def gumbel_noise(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, vocab: torch.Tensor | None = None
) -> torch.Tensor:
    """Gumbel(0, 1) noise, [B, W, V] float32, for `seeds` [B] and output `positions` [B, W]: a pure function of
    (seed, position, token id). `vocab`: `vocab_keys(vocab_size, device)` when the caller keeps it."""
    device = positions.device
    key = _mix(_mix(seeds.to(device=device, dtype=torch.long)[:, None] & _MASK32) ^ positions.long())  # [B, W]
    if vocab is None:
        vocab = vocab_keys(vocab_size, device)
    bits = _mix(key[..., None] ^ vocab)  # [B, W, V], 32 random bits each
    uniform = ((bits >> 8).float() + 0.5) / float(1 << 24)  # (0, 1), 24 bits: float32's mantissa
    return -torch.log(-torch.log(uniform))


def filtered(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """`logits / T` with what top-k and top-p remove set to -inf (HF's warpers, in HF's order)."""
    x = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < x.shape[-1]:
        kth = x.topk(sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = x.sort(dim=-1, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - sampling.top_p
        drop[..., -1] = False  # keep at least the most likely token
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x


class Sampler:
    """Picks the token after each slot: the argmax under greedy decoding (no `sampling`), else the Gumbel-max
    sample of the filtered logits with the request's noise at that output position."""

    def __init__(self, sampling: Sampling | None, seeds: Sequence[int] | None, batch: int) -> None:
        if seeds is not None and len(seeds) != batch:
            raise ValueError(f"seeds: {len(seeds)} given for {batch} prompts")
        self.sampling = sampling
        self.seeds = torch.tensor(list(seeds) if seeds is not None else range(batch), dtype=torch.long)
        self._vocab_keys: dict[tuple[int, torch.device], torch.Tensor] = {}

    @property
    def greedy(self) -> bool:
        return self.sampling is None

    def pick(self, logits: torch.Tensor, rows: Sequence[int], positions: torch.Tensor | None = None) -> torch.Tensor:
        """`logits` [B, W, V] of the requests `rows` (their indices in the batch given to the decoder); `positions`
        [B, W]: the output position of the token each slot predicts (ignored when greedy). Returns [B, W]."""
        if self.sampling is None:
            return logits.argmax(-1)
        seeds = self.seeds[list(rows)]
        size = logits.shape[-1]
        vocab = self._vocab_keys.get((size, logits.device))
        if vocab is None:
            vocab = self._vocab_keys[(size, logits.device)] = vocab_keys(size, logits.device)
        noise = gumbel_noise(seeds, positions, size, vocab)
        return (filtered(logits, self.sampling) + noise).argmax(-1)
