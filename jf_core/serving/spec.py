"""What the server reads of a model directory: its decode config and the dispatch's prior, from the model's
`jacobi_forcing` block (jf_core/model_dir.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jf_core.decoding.jacobi import JacobiConfig
from jf_core.model_dir import read_block


@dataclass
class ServingSpec:
    decode: JacobiConfig
    ar_above_batch: int | None = None
    break_even_tpf: float | None = None
    crossover: dict = field(default_factory=dict)
    hardware: str | None = None
    dtype: str | None = None


def serving_spec(model_dir: str | Path, decode: JacobiConfig) -> ServingSpec:
    block = read_block(model_dir) or {}
    return ServingSpec(
        decode=decode,
        ar_above_batch=block.get("ar_above_batch"),
        break_even_tpf=block.get("break_even_tpf"),
        crossover=block.get("crossover") or {},
        hardware=block.get("hardware"),
        dtype=block.get("dtype"),
    )
