"""A model's decode config as the decoders' types: the `decode` entry of its `jacobi_forcing` block
(jf_core/model_dir.py), written by the round's tune step or by `jf tune`, read by `jf decode`, `jf eval`, `jf serve`
and the registry's model. A plain Jacobi config, or a Jacobi Forcing one (multi-block, recycling) when it sets any of
their fields."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.model_dir import saved_decode_config


def config_from_dict(data: dict) -> JacobiConfig:
    jf_only = {f.name for f in fields(JFDecodeConfig)} - {f.name for f in fields(JacobiConfig)}
    known = {f.name for f in fields(JFDecodeConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"decode config: unknown field(s) {', '.join(sorted(unknown))}")
    return JFDecodeConfig(**data) if jf_only & set(data) else JacobiConfig(**data)


def load_decode_config(model_dir: str | Path | None, **overrides) -> JacobiConfig:
    """The model's saved config (plain Jacobi n=16 when it has none), with non-None `overrides` applied."""
    data = saved_decode_config(model_dir) or {"block_size": 16}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data)
