"""Where a decoding cycle's time goes: the wall time of each named part of the Jacobi step, summed over a decode.

A cycle (one forward of every active row) is laid out, run and settled by Python and torch around the model's own
forward; on a CPU every part is paid at batch 1, so what a cycle costs in AR steps (the figure a speedup divides TPF
by) is the sum of its parts. The decoders name their parts (`JacobiDecoder.step`) and time them only when handed a
`CycleClock`; the default `NO_CLOCK` times nothing and costs a shared no-op context per part.

Parts, in step order: `layout` (the batch's plan, each row's window and its proposers' slots), `tensors` (the rows,
their positions and tree mask as tensors), `forward` (the model's forward over the cache, the proposers' acting
contexts included; its LM head is also timed apart as `head` when the clock watches the model), `pick` (the token
after each slot), `verify` (each row's branches against its picks, the proposers' guesses and learning, the
settling into the next window), `keep` (the cache's slots kept), and outside the step `drop+compact` (finished rows
dropped, the cache compacted).

A `CycleClock` also counts what each slot earned (`outcomes`: by who laid it out and its depth, the slots laid out
and those accepted; layout.py `slot_outcomes`) and who won each row's forward (`wins`), keeping its own counting
time apart (`bookkeeping`) so that it is not charged to the decode."""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import torch

from jf_core.decoding.layout import Layout, tally_outcomes, winner

_NOTHING = contextlib.nullcontext()


class NoClock:
    """Times nothing: the decoders' default."""

    def part(self, name: str) -> contextlib.AbstractContextManager:
        return _NOTHING

    def cycle(self, slots: int) -> None:
        """One cycle ended, its forward having run `slots` tokens over all rows."""

    def outcome(self, layouts: list[Layout], picks: list[list[int]]) -> None:
        """A cycle's layouts and the picks after each of their slots, once verified."""


NO_CLOCK = NoClock()


class CycleClock(NoClock):
    """Sums the wall time of each named part and counts cycles; CUDA is synchronised at every boundary (profiling
    only: the synchronisations cost a GPU its overlap)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self.cycles = 0
        self.slots = 0
        # (owner, depth) -> [slots laid out, slots accepted]
        self.outcomes: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        # Forwards by who won them (layout.py `winner`; None: only the known-correct token): a proposer's guesses
        # are the next window's where it wins, so who wins says whose picks the next forward starts from.
        self.wins: Counter = Counter()
        self.bookkeeping = 0.0  # seconds spent counting `outcomes` and `wins`, inside the decode's wall time

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.seconds[name] += self._now() - start

    def cycle(self, slots: int) -> None:
        self.cycles += 1
        self.slots += slots

    def outcome(self, layouts: list[Layout], picks: list[list[int]]) -> None:
        start = time.perf_counter()
        for lay, row in zip(layouts, picks, strict=True):
            tally_outcomes(self.outcomes, lay, row)
            self.wins[winner(lay, row)[0]] += 1
        self.bookkeeping += time.perf_counter() - start

    @contextlib.contextmanager
    def watching_head(self, model: torch.nn.Module) -> Iterator[None]:
        """Time the model's LM head apart (as `head`, inside `forward`) while the context is open."""
        head = model.get_output_embeddings()
        started: list[float] = []
        pre = head.register_forward_pre_hook(lambda *_: started.append(self._now()))

        def post(*_):
            self.seconds["head"] += self._now() - started.pop()

        post_handle = head.register_forward_hook(post)
        try:
            yield
        finally:
            pre.remove()
            post_handle.remove()

    def per_cycle_ms(self) -> dict[str, float]:
        """Each part's mean ms per cycle."""
        return {name: 1000 * s / self.cycles for name, s in self.seconds.items()} if self.cycles else {}
