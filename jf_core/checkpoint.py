"""Atomic model directories: written under a temporary sibling and renamed, so a reader never sees half a model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def save_checkpoint(
    model: Any, out_dir: Path, tokenizer: Any | None = None, extra_files: dict[str, str] | None = None
) -> Path:
    """`save_pretrained` (safetensors) the model, and the tokenizer if given, into `out_dir` atomically.

    An existing `out_dir` is replaced only after the new one is complete."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
