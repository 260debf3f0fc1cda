"""Counters kept in vLLM's worker process, for whoever started vLLM (the benchmark, the tests): with
`JF_VLLM_STATS_DIR` set, each worker keeps `<dir>/<pid>.json` current. A background thread writes it at most every
`FLUSH_SECONDS` when the counters changed: a file write per step cost the plugin about a fifth of its speed on the
tiny model (a step is ~3 ms there); readers wait for the counters to settle (`settled`).

- `forwards`, `tokens`: request-steps that committed tokens, and the tokens they committed, for any drafter (counted
  where the model runner hands them to the proposer). TPF is tokens / forwards. vLLM's own counters cannot give it:
  its accepted-draft counts include tokens accepted past a request's end (EOS or max_tokens), which a trained
  model's confident last block makes large, and they skip the steps that proposed nothing.
- `jacobi`: the Jacobi drafter's counters (DraftStats), when it is the proposer.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jf_core.atomic import write_json_atomic

STATS_DIR_ENV = "JF_VLLM_STATS_DIR"


FLUSH_SECONDS = 0.05


class WorkerStats:
    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"{os.getpid()}.json"
        self.forwards = self.tokens = 0
        self._drafter: Any = None
        self._dirty = threading.Event()
        self._thread: threading.Thread | None = None

    def count(self, sampled_token_ids: Any, drafter: Any = None) -> None:
        if isinstance(sampled_token_ids, list):
            rows = [len(s) for s in sampled_token_ids if len(s)]
            self.forwards += len(rows)
            self.tokens += sum(rows)
        self._drafter = drafter
        if self._thread is None:
            self._thread = threading.Thread(target=self._flush_loop, name="jf-vllm-stats", daemon=True)
            self._thread.start()
        self._dirty.set()

    def _flush_loop(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            self.write()
            time.sleep(FLUSH_SECONDS)

    def write(self) -> None:
        data = {"pid": os.getpid(), "forwards": self.forwards, "tokens": self.tokens}
        stats = getattr(getattr(self._drafter, "drafter", None), "stats", None)
        if stats is not None:
            data["jacobi"] = asdict(stats)
        write_json_atomic(self.path, data)  # a reader sees the previous counters or these


def worker_stats() -> WorkerStats | None:
    directory = os.environ.get(STATS_DIR_ENV)
    return WorkerStats(directory) if directory else None


def read_all(directory: str | Path) -> list[dict]:
    """Every worker's latest counters under `directory`."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]


def settled(directory: str | Path, timeout: float = 5.0) -> list[dict]:
    """The counters once two reads `FLUSH_SECONDS` apart (and then some) agree: the last step's are written."""
    deadline = time.monotonic() + timeout
    last = read_all(directory)
    while time.monotonic() < deadline:
        time.sleep(4 * FLUSH_SECONDS)
        now = read_all(directory)
        if now == last:
            return now
        last = now
    return last
