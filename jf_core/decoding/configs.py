"""A model's decode config as the decoders' types: the `decode` entry of its `jacobi_forcing` block
(jf_core/model_dir.py), written by the round's tune step or by `jf tune`, read by `jf decode`, `jf eval`, `jf serve`
and the registry's model. A plain Jacobi config, or a Jacobi Forcing one (multi-block, recycling) when it sets any of
their fields.

`ServingSpec` is that config with the dispatch's prior stored beside it (`model_dir.ServingPrior`: the crossover
`jf tune` measured): how every consumer decodes the model, the evaluation's headline as much as the server."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator

from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.model_dir import ServingPrior, read_block, saved_decode_config


def config_from_dict(data: dict) -> JacobiConfig:
    """The decode config a dict of fields describes: a JFDecodeConfig when it sets any of that type's own fields."""
    jf_only = {f.name for f in fields(JFDecodeConfig)} - {f.name for f in fields(JacobiConfig)}
    known = {f.name for f in fields(JFDecodeConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"decode config: unknown field(s) {', '.join(sorted(unknown))}")
    return JFDecodeConfig(**data) if jf_only & set(data) else JacobiConfig(**data)


def as_decode_config(value: JacobiConfig | dict) -> JacobiConfig:
    return value if isinstance(value, JacobiConfig) else config_from_dict(value)


# A decode config as a field of a pydantic result or config (an evaluation, a round's summary, an ablation): the type
# in Python, its fields in JSON, read back as the same type (a JFDecodeConfig stays one).
DecodeConfig = Annotated[JacobiConfig, PlainValidator(as_decode_config), PlainSerializer(asdict, return_type=dict)]


def load_decode_config(model_dir: str | Path | None, **overrides) -> JacobiConfig:
    """The model's saved config (plain Jacobi n=16 when it has none), with non-None `overrides` applied."""
    data = saved_decode_config(model_dir) or {"block_size": 16}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data)


@dataclass
class ServingSpec:
    decode: JacobiConfig
    prior: ServingPrior | None = None  # None: never tuned with a crossover (a hub id, a plain model)

    @property
    def ar_above_batch(self) -> int | None:
        """Above this batch size AR was measured faster (None: never, or not measured)."""
        return self.prior.ar_above_batch if self.prior else None

    @property
    def tuned(self) -> JFDecodeConfig | None:
        """The tuned Jacobi Forcing config, None for a model decoded with plain Jacobi (never tuned)."""
        return self.decode if isinstance(self.decode, JFDecodeConfig) else None


def serving_spec(model_dir: str | Path, decode: JacobiConfig) -> ServingSpec:
    """`decode` with the dispatch's prior the model directory stores (none for a hub id or a plain model)."""
    block = read_block(model_dir) if Path(model_dir).is_dir() else None
    return ServingSpec(decode=decode, prior=ServingPrior.of_block(block))


def load_serving_spec(model_dir: str | Path, **overrides) -> ServingSpec:
    """The model's saved decode config (`load_decode_config`, with `overrides`) and its stored dispatch prior."""
    return serving_spec(model_dir, load_decode_config(model_dir, **overrides))
