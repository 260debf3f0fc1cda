"""Loading any HF causal LM and its tokenizer from a local directory or a hub id."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from jf_core.checksums import CorruptFileError, verify
from jf_core.decoding import StopTokens
from jf_core.decoding.kv import UnsupportedModelError, attention_layout
from jf_core.decoding.proposers.suffix import attach_corpus, load_corpus
from jf_core.draft_adapter.adapter import load_draft_adapter
from jf_core.layers import prepare_for_decoding

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
    lm_head_fp32: bool = False  # decoding only: logits from an fp32 copy of the LM head (layers/heads.py)

    def resolved_device(self) -> torch.device:
        return resolve_device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            # bf16 where the hardware has it; CPU decoding and the exactness tests want fp32. A named device is
            # taken at its word: a driver without GPUs names its workers' dtype.
            cuda = torch.cuda.is_available() if self.device == "auto" else torch.device(self.device).type == "cuda"
            return torch.bfloat16 if cuda else torch.float32
        return getattr(torch, self.dtype)


def resolve_device(name: str = "auto") -> torch.device:
    """The one device rule: `auto` is CUDA where a device is visible, else the CPU; a named CUDA device that is not
    there is refused by name (rather than failing later inside torch, or training on the CPU unasked)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device: {name!r}, but no CUDA device is visible here (use auto or cpu)")
    return device


def pick_attention(requested: str = "auto", device: torch.device | None = None, model_class: type | None = None) -> str:
    """What was requested, else: flash_attention_2 where flash_attn imports, the model runs on CUDA and its class
    supports it; else sdpa where the class supports it; else eager. Decoding hands flash-attention only 2D masks
    and runs the layouts it cannot take (recycled branches) on SDPA, or eager (jf_core/decoding/kv.py)."""
    if requested != "auto":
        return requested
    on_cuda = (device or resolve_device()).type == "cuda"
    supports = (lambda flag: bool(getattr(model_class, flag, True))) if model_class is not None else (lambda _f: True)
    if on_cuda and importlib.util.find_spec("flash_attn") is not None and supports("_supports_flash_attn"):
        return "flash_attention_2"
    return "sdpa" if supports("_supports_sdpa") else "eager"


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).expanduser().exists()


def load_model(path: str | ModelSpec, **overrides):
    """Return (model in eval mode, tokenizer). Raises ModelLoadError naming the problem for a missing directory,
    a checkpoint that is not a causal LM, weights that are not safetensors, or a tokenizer without an EOS token.

    Weights load from safetensors only: a pickled checkpoint (pytorch_model.bin) can run code when it is read.
    Code shipped with a checkpoint runs only with `trust_remote_code=True` (off by default)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from jf_core.quiet import bars_only_when_slow

    bars_only_when_slow()
    spec = path if isinstance(path, ModelSpec) else ModelSpec(path=path, **overrides)
    location = spec.path
    if _looks_local(location):
        directory = Path(location).expanduser()
        if not directory.is_dir():
            raise ModelLoadError(f"model directory {directory} does not exist")
        if not (directory / "config.json").is_file():
            raise ModelLoadError(f"{directory} has no config.json: not a Hugging Face model directory")
        try:
            verify(directory)  # the weights are the bytes that were written (checksums.sha256), when it has one
        except CorruptFileError as err:
            raise ModelLoadError(str(err)) from None
        location = str(directory)
    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"cannot read a model config from {spec.path!r}: {err}") from err
    device = spec.resolved_device()
    # The class `from_pretrained` will build (the Auto class's public mapping), for the attention it supports.
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None) if not spec.trust_remote_code else None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=spec.resolved_dtype(),
            attn_implementation=pick_attention(spec.attn_implementation, device, model_class),
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
    try:
        attention_layout(model)  # refuse, by name, what the exact decoders cannot run (recurrent, chunked, ...)
    except UnsupportedModelError as err:
        raise ModelLoadError(f"{spec.path!r}: {err}") from err
    tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=spec.trust_remote_code)
    check_tokenizer(tokenizer, spec.path)
    if tokenizer.pad_token_id is None:
        # Padding is only ever masked out; EOS is a safe stand-in and is what HF generate does too.
        tokenizer.pad_token = tokenizer.eos_token
    model = prepare_for_decoding(model, device, lm_head_fp32=spec.lm_head_fp32)
    if _looks_local(location):
        try:  # a draft-only LoRA kept beside the weights drafts; the weights verify (draft_adapter.py)
            load_draft_adapter(model, Path(location))
            attach_corpus(model, load_corpus(location))  # earlier outputs that suffix drafts copy (suffix.py)
        except ValueError as err:
            raise ModelLoadError(str(err)) from err
    return model, tokenizer


def eos_token_ids(tokenizer, model: torch.nn.Module | None = None) -> tuple[int, ...]:
    """Every id that ends a generation: the tokenizer's EOS and the generation config's (Qwen instruct checkpoints
    list two, `<|im_end|>` and `<|endoftext|>`; stopping on one alone runs past the end of the answer)."""
    ids = [tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += configured if isinstance(configured, list | tuple) else [configured]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def stop_tokens(model: torch.nn.Module, tokenizer) -> StopTokens:
    """Where this model's sequences end (every EOS id) and what pads its batches: `decode(..., stop=stop_tokens(model,
    tok))`."""
    return StopTokens(eos_token_ids(tokenizer, model), tokenizer.pad_token_id)


def check_tokenizer(tokenizer, where: str) -> None:
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"the tokenizer of {where!r} has no eos token: decoding could never stop")
