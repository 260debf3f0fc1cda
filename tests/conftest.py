"""Shared fixtures: tiny random-weight models of two real architectures, built from config objects (no downloads),
and the embedded default model (bootstrapped once into the project cache when missing)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("DO_NOT_TRACK", "true")

torch.set_num_threads(min(2, torch.get_num_threads()))

VOCAB = 512
PAD = 0


def _qwen2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _llama() -> torch.nn.Module:
    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(cfg).eval()


TINY_MODELS = {"qwen2": _qwen2, "llama": _llama}


@pytest.fixture(scope="session", params=sorted(TINY_MODELS))
def tiny_model(request) -> torch.nn.Module:
    return TINY_MODELS[request.param]()


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded default, from the cache; bootstraps it once when missing."""
    from jf_core.models import load_model
    from jf_core.toy.bootstrap import ensure_embedded_model

    path = ensure_embedded_model()
    return load_model(str(path))
