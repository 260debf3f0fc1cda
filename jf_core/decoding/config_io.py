"""A model's decode config: the `decode` entry of the `jacobi_forcing` block in its `config.json`
(jf_core/serving/artifact.py), written by the round's tune step or by `jf tune`, read by `jf decode`, `jf eval`,
`jf serve` and the registry's model. Plain Jacobi or Jacobi Forcing decoding (multi-block and recycling), one entry
point for both. Model directories from before the block (a `decode_config.json` beside the weights) still load."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

import torch

from jf_core.decoding.common import DecodeOutput, EosIds, TokenSink
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode
from jf_core.decoding.sampling import Sampling

DECODE_CONFIG = "decode_config.json"


def config_from_dict(data: dict) -> JacobiConfig:
    jf_only = {f.name for f in fields(JFDecodeConfig)} - {f.name for f in fields(JacobiConfig)}
    known = {f.name for f in fields(JFDecodeConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"decode config: unknown field(s) {', '.join(sorted(unknown))}")
    return JFDecodeConfig(**data) if jf_only & set(data) else JacobiConfig(**data)


def saved_decode_config(model_dir: str | Path | None) -> dict | None:
    """The model's saved decode config as a dict, or None when it has none."""
    from jf_core.serving.artifact import read_block

    if not model_dir or not Path(model_dir).is_dir():
        return None
    block = read_block(model_dir)
    if block and block.get("decode"):
        return dict(block["decode"])
    legacy = Path(model_dir) / DECODE_CONFIG
    return json.loads(legacy.read_text()) if legacy.is_file() else None


def load_decode_config(model_dir: str | Path | None, **overrides) -> JacobiConfig:
    """The model's saved config (plain Jacobi n=16 when it has none), with non-None `overrides` applied."""
    data = saved_decode_config(model_dir) or {"block_size": 16}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data)


def save_decode_config(model_dir: str | Path, config: JacobiConfig, extra: dict | None = None) -> Path:
    """Store the config in the model's `jacobi_forcing` block; `extra` (the tuning report) goes beside it."""
    from jf_core.serving.artifact import update_block

    path = update_block(model_dir, decode=asdict(config))
    (Path(model_dir) / DECODE_CONFIG).unlink(missing_ok=True)  # one place for it
    if extra is not None:
        report = Path(model_dir) / "decode_tuning.json"
        fd, tmp = tempfile.mkstemp(prefix=".decode_tuning.json.", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(extra, fh, indent=2)
        os.replace(tmp, report)
    return path


def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    eos_token_id: EosIds,
    pad_token_id: int,
    on_tokens: TokenSink | None = None,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
    ar_above_batch: int | None = None,
) -> DecodeOutput:
    """Greedy when `sampling` is None; otherwise exact sampling with one seed per prompt (sampling.py). A batch
    larger than `ar_above_batch` (the crossover `jf tune` stores in the model's `jacobi_forcing` block) runs AR:
    there AR was measured faster, and the text is the same."""
    stops = {
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "on_tokens": on_tokens,
        "sampling": sampling,
        "seeds": seeds,
    }
    if ar_above_batch is not None and len(prompts) > ar_above_batch:
        from jf_core.decoding.ar import ar_decode

        return ar_decode(model, prompts, max_new_tokens=config.max_new_tokens, **stops)
    if isinstance(config, JFDecodeConfig):
        return jf_decode(model, prompts, config, **stops)
    return jacobi_decode(model, prompts, config, **stops)
