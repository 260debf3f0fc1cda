"""A model directory: what it holds, how it is written, and what of it is the model.

A Jacobi Forcing model directory is a plain Hugging Face checkpoint, so any HF-compatible runtime loads it and
decodes it autoregressively:

    config.json                 the model's config, with a `jacobi_forcing` block (below) that transformers keeps
    model.safetensors           weights (safetensors only: a pickle can run code when it is read)
    tokenizer files, generation_config.json
    checksums.sha256            the weights' checksums, checked at load (jf_core/checksums.py)
    done.json                   a training stage's summary, written last (DONE)
    decode_tuning.json          the tuning report behind the stored decode config
    bootstrap.json, provenance.json   how the embedded model was trained, where an imported model came from

The block says how this model should be decoded and where that was measured:

    "jacobi_forcing": {
      "format": 1,
      "decode": {"block_size": 64, "num_blocks": 2, "pool_size": 4, ...},   # the tuned decode config
      "ar_above_batch": 16,        # above this batch size AR was faster (null: Jacobi won at every size measured)
      "break_even_tpf": 1.9,       # accepted tokens per forward below which a Jacobi step costs more than it gives
      "crossover": {"batch_sizes": [1, 2, 4], "speedup_vs_ar": [2.4, 2.1, 1.6]},
      "hardware": "NVIDIA H100 80GB HBM3",                                     # where the figures were measured
      "dtype": "bfloat16",
      "lineage": {"base": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "rounds": 2}   # the chain this model was trained in
    }

Files about the model rather than of it (NOT_THE_MODEL) and the block itself are not what the model is: the
fingerprint ignores them and the registry's copy leaves the files out. Every writer here is atomic: a reader sees
the old directory (or config) or the new one, never half of one.

This module sits at the bottom of jf_core: the decoders, loaders, trainers and the server read and write model
directories through it, and it imports none of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jf_core.atomic import write_json_atomic
from jf_core.checksums import write_manifest

BLOCK_KEY = "jacobi_forcing"
FORMAT = 1
DONE = "done.json"  # a stage's marker and summary, written last: its presence means the stage finished
DECODE_TUNING = "decode_tuning.json"
LEGACY_DECODE_CONFIG = "decode_config.json"  # the decode config beside the weights, before the block held it: refused
NOT_THE_MODEL = frozenset({DONE, LEGACY_DECODE_CONFIG, DECODE_TUNING, "bootstrap.json", "provenance.json"})


# -- writing a directory ------------------------------------------------------------------------------------------


def save_checkpoint(
    model: Any, out_dir: Path, tokenizer: Any | None = None, extra_files: dict[str, str] | None = None
) -> Path:
    """`save_pretrained` (safetensors) the model, and the tokenizer if given, into `out_dir` atomically.

    An existing `out_dir` is replaced only after the new one is complete."""
    from jf_core.quiet import bars_only_when_slow

    bars_only_when_slow()
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
    extra_tensors: dict[str, tuple[dict, dict[str, str]]] | None = None,
    block: dict | None = None,
) -> Path:
    """A trained model's directory, atomically: its weights (or `state_dict`, e.g. one gathered from shards) in
    `dtype` (the model's own, typically bf16, though training kept fp32 masters), its tokenizer and extra files;
    `extra_tensors`: {file name: (tensors, metadata)} written as safetensors beside the weights (a draft adapter);
    `block` entries are merged into the config's `jacobi_forcing` block in the same write."""
    import torch

    state = state_dict if state_dict is not None else model.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) if torch.is_floating_point(v) else v for k, v in state.items()}

    class _Weights:
        def save_pretrained(self, path, **kwargs):
            model.save_pretrained(path, state_dict=state, safe_serialization=True)
            if extra_tensors:
                from safetensors.torch import save_file

                for name, (tensors, metadata) in extra_tensors.items():
                    save_file(tensors, str(Path(path) / name), metadata=metadata)
            if dtype is not None or block:
                config = Path(path) / "config.json"
                data = json.loads(config.read_text())
                if dtype is not None:  # the config says what the weights are
                    data["dtype"] = str(dtype).removeprefix("torch.")
                if block:
                    data[BLOCK_KEY] = {**data.get(BLOCK_KEY, {}), **block}
                config.write_text(json.dumps(data, indent=2))

    return save_checkpoint(_Weights(), out_dir, tokenizer=tokenizer, extra_files=extra_files)


# -- the jacobi_forcing block ---------------------------------------------------------------------------------------


def read_block(model_dir: str | Path) -> dict | None:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get(BLOCK_KEY)


def write_block(model_dir: str | Path, block: dict) -> Path:
    """Set the block in `config.json` (atomically: a reader sees the old file or the new one)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a model directory (no config.json)")
    config = json.loads(path.read_text())
    config[BLOCK_KEY] = {"format": FORMAT, **{k: v for k, v in block.items() if k != "format"}}
    write_json_atomic(path, config, sort_keys=True)
    return path


def update_block(model_dir: str | Path, **values) -> Path:
    return write_block(model_dir, {**(read_block(model_dir) or {}), **values})


def without_block(config_text: str) -> bytes:
    """`config.json` as the weights see it: the block is about the model, not of it (fingerprints ignore it)."""
    config = json.loads(config_text)
    config.pop(BLOCK_KEY, None)
    return json.dumps(config, sort_keys=True).encode()


def lineage(model_in: str) -> dict:
    """The `lineage` entry of a model trained from `model_in`: the chain's original base model (the first one not
    trained by this project; the gate holds every round to its accuracy) and how many rounds deep this model is."""
    prior = (read_block(model_in) or {}).get("lineage") or {}
    return {"base": prior.get("base", str(model_in)), "rounds": int(prior.get("rounds", 0)) + 1}


def lineage_base(model: str) -> str:
    """The original base model of `model`'s chain: itself unless this project trained it."""
    return ((read_block(model) or {}).get("lineage") or {}).get("base", str(model))


# -- the decode config (the block's `decode` entry) -------------------------------------------------------------


def saved_decode_config(model_dir: str | Path | None) -> dict | None:
    """The model's saved decode config as a dict, or None when it has none. A directory from before the block held
    it (a `decode_config.json` beside the weights, and no `decode` in the block) is refused, naming the fix."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    block = read_block(model_dir)
    if block and block.get("decode"):
        return dict(block["decode"])
    if (Path(model_dir) / LEGACY_DECODE_CONFIG).is_file():
        raise ValueError(
            f"{Path(model_dir) / LEGACY_DECODE_CONFIG}: a decode config in the format of an older version of this "
            "project (beside the weights); the model's config.json holds it now. Store it there with "
            f"`jf tune --model {model_dir}`, or delete the file to decode with plain Jacobi"
        )
    return None


def save_decode_config(model_dir: str | Path, config: Any) -> Path:
    """Store `config` (a decode config dataclass, or its dict) in the block."""
    return update_block(model_dir, decode=_stored(config))


def _stored(config: Any) -> dict:
    """A decode config as the block stores it: its fields (this layer knows the decoders' types only as data)."""
    return asdict(config) if not isinstance(config, dict) else dict(config)


# -- where the decode config was measured (the block's crossover entries) ---------------------------------------


@dataclass
class Crossover:
    """AR against the tuned Jacobi config at several batch sizes on calibration prompts, taking turns."""

    batch_sizes: list[int]
    speedup_vs_ar: list[float]  # Jacobi TPS / AR TPS at each batch size
    tpf: list[float]  # Jacobi's tokens per forward at each batch size

    @property
    def ar_above_batch(self) -> int | None:
        """The largest measured batch size from which on Jacobi stops paying (None: it paid at every size)."""
        for i, speedup in enumerate(self.speedup_vs_ar):
            if speedup < 1.0:
                return self.batch_sizes[i - 1] if i else 0
        return None

    @property
    def break_even_tpf(self) -> float:
        """TPF at which a Jacobi forward would give what it costs, at batch 1: a Jacobi forward costs TPF / speedup
        AR steps, so below that acceptance AR is faster."""
        return self.tpf[0] / self.speedup_vs_ar[0] if self.speedup_vs_ar[0] > 0 else float("inf")


def hardware_name(device: Any = None) -> str:
    """The accelerator's name (CUDA), or the CPU's model and thread count."""
    import torch

    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu} ({torch.get_num_threads()} threads)"


@dataclass(frozen=True)
class ServingPrior:
    """The dispatch's prior, typed once: the crossover `jf tune` measured, what follows from it, and where it was
    measured. Written into the model's block by the tune (its result holds it too); read by every dispatch (the
    server, `jf decode`, the evaluation's dispatched row, the vLLM plugin) through `ServingPrior.of_block`."""

    crossover: Crossover
    ar_above_batch: int | None  # above this batch size AR was measured faster (None: Jacobi paid at every size)
    break_even_tpf: float  # the running TPF below which a Jacobi forward costs more than it gives
    hardware: str
    dtype: str

    @classmethod
    def measured(cls, crossover: Crossover, device: Any, dtype: str) -> ServingPrior:
        even = round(crossover.break_even_tpf, 4)
        return cls(crossover, crossover.ar_above_batch, even, hardware_name(device), dtype)

    @classmethod
    def of_block(cls, block: dict | None) -> ServingPrior | None:
        """The prior a model's block stores (None: never tuned with a crossover)."""
        if not block or not block.get("crossover"):
            return None
        return cls(
            Crossover(**block["crossover"]),
            block.get("ar_above_batch"),
            block["break_even_tpf"],
            block["hardware"],
            block["dtype"],
        )

    def block(self) -> dict:
        """Its entries in the model's block (`update_block(model_dir, **prior.block())`)."""
        return asdict(self)

    def speedup_at(self, batch_size: int) -> float:
        """Jacobi's TPS over AR's by the crossover at the largest measured batch size <= `batch_size` (the smallest
        measured, below it)."""
        cross = self.crossover
        at = [x for b, x in zip(cross.batch_sizes, cross.speedup_vs_ar, strict=True) if b <= batch_size]
        return at[-1] if at else cross.speedup_vs_ar[0]


# -- what the model is ----------------------------------------------------------------------------------------------


def model_fingerprint(model_dir: str | Path) -> str:
    """A content hash of a saved model directory's weights, config and tokenizer (sha256 over file contents).

    Files about the model rather than of it (its training summary, decode config) do not count."""
    digest = hashlib.sha256()
    directory = Path(model_dir)
    for f in sorted(directory.iterdir()):
        if f.suffix in {".safetensors", ".json"} and f.is_file() and f.name not in NOT_THE_MODEL:
            digest.update(f.name.encode())
            if f.name == "config.json":  # canonical, and without the jacobi_forcing block: how to decode it
                digest.update(without_block(f.read_text()))  # is not what the model is
                continue
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def registry_copy(model_dir: str | Path, dest: Path, fallback_decode: Any = None) -> Path:
    """The model directory as a plain HF checkpoint for a registry: weights, config (with its block), generation
    config and tokenizer; training summaries and tuning reports stay with the run. `fallback_decode` (a decode
    config) is stored when the model has no decode config of its own."""
    src = Path(model_dir)
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in NOT_THE_MODEL and not f.name.startswith("."):
            shutil.copy2(f, dest / f.name)
    decode = saved_decode_config(src) or (fallback_decode and _stored(fallback_decode))
    if decode:
        update_block(dest, decode=decode)
    return dest
