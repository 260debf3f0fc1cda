"""A model's decode config: `decode_config.json` beside its weights, written by the round's evaluation or by
`jf tune`, read by `jf decode`, `jf eval` and the registry's pyfunc. Plain Jacobi or Jacobi Forcing decoding
(multi-block and recycling), one entry point for both."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

import torch

from jf_core.decoding.common import DecodeOutput, EosIds
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode

DECODE_CONFIG = "decode_config.json"


def config_from_dict(data: dict) -> JacobiConfig:
    jf_only = {f.name for f in fields(JFDecodeConfig)} - {f.name for f in fields(JacobiConfig)}
    known = {f.name for f in fields(JFDecodeConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"decode config: unknown field(s) {', '.join(sorted(unknown))}")
    return JFDecodeConfig(**data) if jf_only & set(data) else JacobiConfig(**data)


def load_decode_config(model_dir: str | Path | None, **overrides) -> JacobiConfig:
    """The model's saved config (plain Jacobi n=16 when it has none), with non-None `overrides` applied."""
    path = Path(model_dir) / DECODE_CONFIG if model_dir else None
    data = json.loads(path.read_text()) if path is not None and path.is_file() else {"block_size": 16}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data)


def save_decode_config(model_dir: str | Path, config: JacobiConfig, extra: dict | None = None) -> Path:
    path = Path(model_dir) / DECODE_CONFIG
    fd, tmp = tempfile.mkstemp(prefix=f".{DECODE_CONFIG}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(config), fh, indent=2)
    os.replace(tmp, path)
    if extra is not None:
        (Path(model_dir) / "decode_tuning.json").write_text(json.dumps(extra, indent=2))
    return path


def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    eos_token_id: EosIds,
    pad_token_id: int,
) -> DecodeOutput:
    if isinstance(config, JFDecodeConfig):
        return jf_decode(model, prompts, config, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return jacobi_decode(model, prompts, config, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
