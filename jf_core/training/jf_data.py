"""Batches for Jacobi Forcing training: packed trajectory examples, optionally mixed with plain AR batches of
ground-truth task data (a check against drifting answers)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch

from jf_core.training.packing import PackedExample, collate


def jf_batches(
    examples: Sequence[PackedExample],
    batch_size: int,
    pad_token_id: int,
    *,
    seed: int,
    variant: str = "shipped",
    ar_batches: Iterator[dict[str, torch.Tensor]] | None = None,
    ar_every: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless shuffled epochs; with `ar_batches` and `ar_every` = k, every k-th batch is a plain AR batch."""
    if not examples:
        raise ValueError("no packed examples to train on (every trajectory was dropped by packing?)")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    count = 0
    while True:
        rng.shuffle(order)
        # Similar lengths per batch keep padding (and the L x L mask) small.
        chunks = [order[i : i + 16 * batch_size] for i in range(0, len(order), 16 * batch_size)]
        batches = []
        for chunk in chunks:
            chunk = sorted(chunk, key=lambda i: examples[i].total_length)
            batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        for idx in batches:
            count += 1
            if ar_batches is not None and ar_every and count % ar_every == 0:
                yield next(ar_batches)
            yield collate([examples[i] for i in idx], pad_token_id, variant)
