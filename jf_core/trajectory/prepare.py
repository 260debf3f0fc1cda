"""Turn a prompt dataset (JSONL, Parquet, a `datasets` directory or a hub id; OpenCodeInstruct-like rows) into the
prompt store a profile names: `<out>/train.jsonl`, `<out>/calib.jsonl` and `<out>/manifest.json`.

- Prompts are rendered and tokenized as trajectory collection will (the profile's prompt format and tokenizer) and
  kept when their length is within [min_prompt_tokens, max_prompt_tokens].
- Exact duplicates (the same rendered prompt) are dropped; the first occurrence stays.
- A calibration split is held out by a hash of the prompt (stable under reordering and re-runs, disjoint from
  training by construction): `calibration` prompts, for choosing n and autotuning without touching the test set.
- The manifest records every count: rows read, kept, and skipped per reason.
The store is written under a temporary name and renamed. A profile then uses `prompts.source: <out>` (split
`train`) and `evaluation.calibration_split: calib`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from jf_core.trajectory.prompt_source import PromptSourceConfig
from jf_core.trajectory.prompts import read_rows, usable_rows


@dataclass
class PrepareReport:
    out: str
    rows_read: int
    train: int
    calibration: int
    skipped: dict[str, int]


def prepare_prompts(
    source: PromptSourceConfig, tokenizer, out: str | Path, *, calibration: int = 200, seed: int = 0
) -> PrepareReport:
    kept: list[tuple[str, str, dict]] = []  # (hash key, id, row to write)
    seen: set[str] = set()
    skipped: Counter = Counter()
    rows = read_rows(source.model_copy(update={"limit": None}))
    for row_id, row, text, _ in usable_rows(source, rows, tokenizer, skipped):
        if text in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(text)
        key = hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()
        field = source.messages_field or source.text_field
        record = {"id": str(row[source.id_field]) if source.id_field and source.id_field in row else row_id}
        record[field] = row[field]
        kept.append((key, record["id"], record))
    rows_read = len(kept) + sum(skipped.values())  # every row read was kept or skipped for one reason
    if len(kept) <= calibration:
        raise ValueError(
            f"{source.source}: {len(kept)} usable prompts, not enough to hold out {calibration} for calibration "
            f"(skipped: {dict(skipped)})"
        )
    held = {key for key, _, _ in sorted(kept)[:calibration]}  # the smallest hashes: a stable, unbiased sample
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        counts = {"train": 0, "calib": 0}
        with open(tmp / "train.jsonl", "w") as train, open(tmp / "calib.jsonl", "w") as calib:
            for key, _, record in kept:
                split = "calib" if key in held else "train"
                (calib if split == "calib" else train).write(json.dumps(record, ensure_ascii=False) + "\n")
                counts[split] += 1
        report = PrepareReport(str(out), rows_read, counts["train"], counts["calib"], dict(skipped))
        manifest = {
            **report.__dict__,
            "source": source.model_dump(mode="json"),
            "tokenizer": getattr(tokenizer, "name_or_path", None),
            "seed": seed,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report
