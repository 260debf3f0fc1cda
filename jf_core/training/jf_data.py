"""Batches for Jacobi Forcing training: packed trajectory examples, optionally mixed with plain AR batches of
ground-truth task data (a check against drifting answers).

A batch's order is separate from its collation (`batch_orders`), so data-parallel workers, each holding only its
share of the examples (`read_packed_share`), can be replayed as one process on the same global batches
(`global_batches`): how the tests hold DDP and FSDP2 to the one-process loss curve.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from jf_core.training.noise import NoiseSchedule
from jf_core.training.packing import PackedExample, PackedRow, blocks_row, collate, redrawn
from jf_core.training.spans import spans_row

# training.packing's layouts: each packs one example as a batch row.
ROWS: dict[str, Callable[[PackedExample, int], PackedRow]] = {"blocks": blocks_row, "spans": spans_row}


def batch_orders(examples: Sequence[PackedExample], batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless shuffled epochs of index lists; batches hold examples of similar lengths (less padding, a smaller
    L x L mask)."""
    if not examples:
        raise ValueError("no packed examples to train on (every trajectory was dropped by packing?)")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    while True:
        rng.shuffle(order)
        chunks = [order[i : i + 16 * batch_size] for i in range(0, len(order), 16 * batch_size)]
        batches = []
        for chunk in chunks:
            chunk = sorted(chunk, key=lambda i: examples[i].total_length)
            batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        yield from batches


def jf_batches(
    examples: Sequence[PackedExample],
    batch_size: int,
    pad_token_id: int,
    *,
    seed: int,
    variant: str = "shipped",
    ar_batches: Iterator[dict[str, torch.Tensor]] | None = None,
    ar_every: int = 0,
    dense_mask: bool = True,
    redraw: NoiseSchedule | None = None,
    copies: int = 1,
    span: int = 0,
    packing: str = "blocks",
    guessed: Callable[[PackedExample, int], int] | None = None,
    guessed_weight: float = 1.0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless collated batches; with `ar_batches` and `ar_every` = k, every k-th batch is a plain AR batch. With
    `redraw` (training.state_pick: each_visit), every block's noisy copy is drawn again from all its states each time
    its example is seen, instead of the one packing fixed (`packing.redrawn`); the pool is read at collation, so
    states added to an example while training (on-policy) are drawn from the next time it is seen. `copies` (> 1
    needs `redraw`): each block's noisy copies a visit (training.noisy_copies), drawn the same way. `span`
    (training.draft_span): `collate`'s; `packing` (training.packing): the layout, a key of `ROWS`. `guessed` and
    `guessed_weight` (training.guessed_weight, spans only): `spans_row`'s."""
    if copies > 1 and redraw is None:
        raise ValueError(
            "training.noisy_copies > 1 draws the copies from each block's states: set state_pick: each_visit"
        )
    row = ROWS[packing]
    if guessed is not None:
        if packing != "spans":
            raise ValueError(f"training.guessed_weight weighs the spans layout's students, not {packing}'s")
        row = functools.partial(spans_row, guessed=guessed, guessed_weight=guessed_weight)
    visits = [0] * len(examples)
    for count, idx in enumerate(batch_orders(examples, batch_size, seed), start=1):
        if ar_batches is not None and ar_every and count % ar_every == 0:
            yield next(ar_batches)
        batch = [_visit(examples, i, visits, redraw, copies) for i in idx]
        out = collate(batch, pad_token_id, variant, dense_mask=dense_mask, span=span, row=row)
        yield {**out, "example": torch.tensor(idx)}  # whose rows they are: a context kept between visits


def _visit(
    examples: Sequence[PackedExample], i: int, visits: list[int], redraw: NoiseSchedule | None, copies: int = 1
) -> PackedExample:
    visit, visits[i] = visits[i], visits[i] + 1
    return examples[i] if redraw is None else redrawn(examples[i], redraw, visit, copies)


def global_batches(
    shares: Sequence[Sequence[PackedExample]],
    batch_size: int,
    pad_token_id: int,
    *,
    seed: int,
    variant: str = "shipped",
    redraw: NoiseSchedule | None = None,
    copies: int = 1,
    span: int = 0,
    packing: str = "blocks",
) -> Iterator[dict[str, torch.Tensor]]:
    """The batches data-parallel workers train on together (worker r: its share, seed + r), as one batch per step."""
    streams = [batch_orders(share, batch_size, seed + rank) for rank, share in enumerate(shares)]
    visits = [[0] * len(share) for share in shares]
    while True:
        examples = [
            _visit(shares[rank], i, visits[rank], redraw, copies)
            for rank, stream in enumerate(streams)
            for i in next(stream)
        ]
        yield collate(examples, pad_token_id, variant, span=span, row=ROWS[packing])


def read_packed_share(path: str | Path, rank: int, world_size: int) -> list[PackedExample]:
    """Worker `rank`'s share of a packed-examples Parquet file (every world_size-th row from `rank`), streamed in
    record batches so that no worker holds the other workers' examples."""
    import pyarrow.parquet as pq

    mine: list[PackedExample] = []
    row = 0
    for part in pq.ParquetFile(path).iter_batches(batch_size=256):
        for record in part.to_pylist():
            if row % world_size == rank:
                mine.append(PackedExample(**record))
            row += 1
    return mine
