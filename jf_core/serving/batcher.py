"""Requests that arrive together decode as one batch: a bounded wait for company, a maximum batch, one batch at a
time on the model (in a worker thread, so the event loop keeps accepting requests and streaming chunks). A batch
shares one sampling setting (greedy, or one temperature/top-k/top-p): a request with another waits, first in line,
for the next batch.

A request's events arrive on its own queue: ("text", chunk) as its tokens become final, then ("done", Completion)
or ("error", exception). A consumer that goes away (a client disconnected mid-stream) simply stops reading: the
batch it was in finishes for the others and its events are dropped with its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from jf_core.serving.engine import Completion, Engine, Method, Request


@dataclass
class Pending:
    request: Request
    events: asyncio.Queue = field(default_factory=asyncio.Queue)

    async def stream(self) -> AsyncIterator[str]:
        """The request's text chunks; returns when it is done (raises what the batch raised)."""
        while True:
            kind, payload = await self.events.get()
            if kind == "text":
                yield payload
            elif kind == "done":
                self.completion = payload
                return
            else:
                raise payload

    async def result(self) -> Completion:
        async for _ in self.stream():
            pass
        return self.completion


class Batcher:
    def __init__(self, engine: Engine, *, max_batch: int = 16, max_wait_s: float = 0.01, method: Method = "auto"):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine, self.max_batch, self.max_wait_s, self.method = engine, max_batch, max_wait_s, method
        self._queue: asyncio.Queue[Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._held: deque[Pending] = deque()  # arrived, but with another sampling setting than the batch formed
        self.batch_sizes: list[int] = []

    def submit(self, request: Request) -> Pending:
        """Queue a request (already checked with `engine.check`); must be called on the serving event loop."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._run())
        pending = Pending(request)
        self._queue.put_nowait(pending)
        return pending

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = self._held.popleft() if self._held else await self._queue.get()
            key = first.request.sampling
            batch, held = [first], deque()
            for pending in self._held:
                (batch if pending.request.sampling == key and len(batch) < self.max_batch else held).append(pending)
            self._held = held
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                left = deadline - loop.time()
                try:
                    pending = self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left)
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                (batch if pending.request.sampling == key else self._held).append(pending)
            self.batch_sizes.append(len(batch))
            await asyncio.to_thread(self._decode, batch, loop)

    def _decode(self, batch: list[Pending], loop: asyncio.AbstractEventLoop) -> None:
        def send(pending: Pending, kind: str, payload) -> None:
            loop.call_soon_threadsafe(pending.events.put_nowait, (kind, payload))

        try:
            completions = self.engine.complete(
                [p.request for p in batch], method=self.method, on_text=lambda i, chunk: send(batch[i], "text", chunk)
            )
        except Exception as err:  # the batch failed: every request in it hears why, the server goes on
            for pending in batch:
                send(pending, "error", err)
            return
        for pending, completion in zip(batch, completions, strict=True):
            send(pending, "done", completion)
