"""Exact decoders for causal LMs: AR, plain Jacobi and Jacobi Forcing (multi-block, rejection recycling).

The front door, for every consumer (the bench, the evaluation, the server, the CLI):

    from jf_core.decoding import decode, load_decode_config
    out = decode(model, prompts, load_decode_config(model_dir), stop=stop_tokens(model, tokenizer))

`decode` (dispatch.py) chooses AR or Jacobi for a batch, the one place that does; `ar_decode` is the baseline every
speedup is measured against. The names resolve lazily, so importing one submodule (the vLLM plugin imports the
draft initialisers) does not import every decoder.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "decode": "dispatch",
    "prior": "dispatch",
    "Dispatch": "dispatch",
    "Decoder": "dispatch",
    "ar_decode": "ar",
    "jacobi_decode": "jacobi",
    "jf_decode": "multiblock",
    "JacobiConfig": "jacobi",
    "JFDecodeConfig": "multiblock",
    "Sampling": "sampling",
    "DecodeOutput": "common",
    "StopTokens": "common",
    "config_from_dict": "configs",
    "DecodeConfig": "configs",
    "load_decode_config": "configs",
    "ServingSpec": "configs",
    "serving_spec": "configs",
    "load_serving_spec": "configs",
}

__all__ = [  # noqa: RUF022 (grouped as _EXPORTS is)
    "decode",
    "prior",
    "Dispatch",
    "Decoder",
    "ar_decode",
    "jacobi_decode",
    "jf_decode",
    "JacobiConfig",
    "JFDecodeConfig",
    "Sampling",
    "DecodeOutput",
    "StopTokens",
    "config_from_dict",
    "DecodeConfig",
    "load_decode_config",
    "ServingSpec",
    "serving_spec",
    "load_serving_spec",
]

if TYPE_CHECKING:
    from jf_core.decoding.ar import ar_decode
    from jf_core.decoding.common import DecodeOutput, StopTokens
    from jf_core.decoding.configs import (
        DecodeConfig,
        ServingSpec,
        config_from_dict,
        load_decode_config,
        load_serving_spec,
        serving_spec,
    )
    from jf_core.decoding.dispatch import Decoder, Dispatch, decode, prior
    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
    from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode
    from jf_core.decoding.sampling import Sampling


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
