"""Counters kept in vLLM's worker process, for whoever started vLLM (the benchmark, the tests): with
`JF_VLLM_STATS_DIR` set, each worker writes `<dir>/<pid>.json` after every proposal.

- `forwards`, `tokens`: request-steps that committed tokens, and the tokens they committed, for any drafter (counted
  where the model runner hands them to the proposer). TPF is tokens / forwards. vLLM's own counters cannot give it:
  its accepted-draft counts include tokens accepted past a request's end (EOS or max_tokens), which a trained
  model's confident last block makes large, and they skip the steps that proposed nothing.
- `jacobi`: the Jacobi drafter's counters (DraftStats), when it is the proposer.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

STATS_DIR_ENV = "JF_VLLM_STATS_DIR"


class WorkerStats:
    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"{os.getpid()}.json"
        self.forwards = self.tokens = 0

    def count(self, sampled_token_ids: Any) -> None:
        if isinstance(sampled_token_ids, list):
            rows = [len(s) for s in sampled_token_ids if len(s)]
            self.forwards += len(rows)
            self.tokens += sum(rows)

    def write(self, drafter: Any = None) -> None:
        data = {"pid": os.getpid(), "forwards": self.forwards, "tokens": self.tokens}
        stats = getattr(getattr(drafter, "drafter", None), "stats", None)
        if stats is not None:
            data["jacobi"] = asdict(stats)
        fd, tmp = tempfile.mkstemp(prefix=".stats.", dir=self.path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.path)  # a reader sees the previous counters or these


def worker_stats() -> WorkerStats | None:
    directory = os.environ.get(STATS_DIR_ENV)
    return WorkerStats(directory) if directory else None


def read_all(directory: str | Path) -> list[dict]:
    """Every worker's latest counters under `directory`."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]
