"""Loading any HF causal LM and its tokenizer from a local directory or a hub id."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

DTypeName = Literal["auto", "float32", "bfloat16", "float16"]


class ModelLoadError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how to place it. `path` is a local directory or a hub id."""

    path: str
    dtype: DTypeName = "auto"
    device: str = "auto"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            # bf16 where the hardware has it; CPU decoding and the exactness tests want fp32.
            return torch.bfloat16 if self.resolved_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)


def pick_attention(requested: str = "auto", device: torch.device | None = None) -> str:
    """flash_attention_2 when flash_attn imports and the model runs on CUDA, else sdpa (or what was requested)."""
    if requested != "auto":
        return requested
    on_cuda = (device.type == "cuda") if device is not None else torch.cuda.is_available()
    if on_cuda and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).expanduser().exists()


def load_model(path: str | ModelSpec, **overrides):
    """Return (model in eval mode, tokenizer). Raises ModelLoadError naming the problem for a missing directory,
    a checkpoint that is not a causal LM, weights that are not safetensors, or a tokenizer without an EOS token.

    Weights load from safetensors only: a pickled checkpoint (pytorch_model.bin) can run code when it is read.
    Code shipped with a checkpoint runs only with `trust_remote_code=True` (off by default)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = path if isinstance(path, ModelSpec) else ModelSpec(path=path, **overrides)
    location = spec.path
    if _looks_local(location):
        directory = Path(location).expanduser()
        if not directory.is_dir():
            raise ModelLoadError(f"model directory {directory} does not exist")
        if not (directory / "config.json").is_file():
            raise ModelLoadError(f"{directory} has no config.json: not a Hugging Face model directory")
        location = str(directory)
    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"cannot read a model config from {spec.path!r}: {err}") from err
    device = spec.resolved_device()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=spec.resolved_dtype(),
            attn_implementation=pick_attention(spec.attn_implementation, device),
            trust_remote_code=spec.trust_remote_code,
            use_safetensors=True,
        )
    except OSError as err:
        if "safetensors" not in str(err):
            raise
        raise ModelLoadError(
            f"{spec.path!r} has no safetensors weights (model.safetensors or its index); pickled weights such as "
            "pytorch_model.bin are never loaded: convert them once with save_pretrained(safe_serialization=True)"
        ) from err
    except ValueError as err:
        raise ModelLoadError(
            f"{spec.path!r} ({type(config).__name__}) is not a causal language model checkpoint: {err}"
        ) from err
    tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=spec.trust_remote_code)
    check_tokenizer(tokenizer, spec.path)
    if tokenizer.pad_token_id is None:
        # Padding is only ever masked out; EOS is a safe stand-in and is what HF generate does too.
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def check_tokenizer(tokenizer, where: str) -> None:
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"the tokenizer of {where!r} has no eos token: decoding could never stop")


NOT_THE_MODEL = {"done.json", "decode_config.json", "decode_tuning.json", "bootstrap.json"}


def model_fingerprint(model_dir: str | Path) -> str:
    """A content hash of a saved model directory's weights, config and tokenizer (sha256 over file contents).

    Files about the model rather than of it (its training summary, decode config) do not count."""
    import hashlib

    digest = hashlib.sha256()
    directory = Path(model_dir)
    for f in sorted(directory.iterdir()):
        if f.suffix in {".safetensors", ".json"} and f.is_file() and f.name not in NOT_THE_MODEL:
            digest.update(f.name.encode())
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]
