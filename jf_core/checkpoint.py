"""Atomic model directories: written under a temporary sibling and renamed, so a reader never sees half a model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jf_core.checksums import write_manifest


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
        write_manifest(tmp)  # last: it covers exactly what was written (jf_core/checksums.py)
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


def save_model_dir(
    model: Any,
    out_dir: Path,
    *,
    tokenizer: Any | None = None,
    state_dict: dict | None = None,
    dtype: Any | None = None,
    extra_files: dict[str, str] | None = None,
    block: dict | None = None,
) -> Path:
    """A trained model's directory, atomically: its weights (or `state_dict`, e.g. one gathered from shards) in
    `dtype` (the model's own, typically bf16, though training kept fp32 masters), its tokenizer and extra files;
    `block` entries are merged into the config's `jacobi_forcing` block (serving/artifact.py) in the same write."""
    import torch

    state = state_dict if state_dict is not None else model.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) if torch.is_floating_point(v) else v for k, v in state.items()}

    class _Weights:
        def save_pretrained(self, path, **kwargs):
            model.save_pretrained(path, state_dict=state, safe_serialization=True)
            if dtype is not None or block:
                import json

                from jf_core.serving.artifact import BLOCK_KEY

                config = Path(path) / "config.json"
                data = json.loads(config.read_text())
                if dtype is not None:  # the config says what the weights are
                    data["dtype"] = str(dtype).removeprefix("torch.")
                if block:
                    data[BLOCK_KEY] = {**data.get(BLOCK_KEY, {}), **block}
                config.write_text(json.dumps(data, indent=2))

    return save_checkpoint(_Weights(), out_dir, tokenizer=tokenizer, extra_files=extra_files)
