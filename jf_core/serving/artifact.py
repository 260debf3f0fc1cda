"""The `jacobi_forcing` block of a model's `config.json`: how this model should be decoded, and where that was measured.

A Jacobi Forcing model directory is a plain Hugging Face checkpoint (safetensors, tokenizer, generation config), so
any HF-compatible runtime loads it and decodes it autoregressively; transformers keeps unknown config keys, so the
block survives `from_pretrained`/`save_pretrained`. This project's loaders read it:

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
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from jf_core.decoding.jacobi import JacobiConfig

BLOCK_KEY = "jacobi_forcing"
FORMAT = 1


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


@dataclass
class ServingSpec:
    decode: JacobiConfig
    ar_above_batch: int | None = None
    break_even_tpf: float | None = None
    crossover: dict = field(default_factory=dict)
    hardware: str | None = None
    dtype: str | None = None


def hardware_name(device: torch.device | str | None = None) -> str:
    """The accelerator's name (CUDA), or the CPU's model and thread count."""
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
    fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def update_block(model_dir: str | Path, **values) -> Path:
    return write_block(model_dir, {**(read_block(model_dir) or {}), **values})


def lineage(model_in: str) -> dict:
    """The `lineage` entry of a model trained from `model_in`: the chain's original base model (the first one not
    trained by this project; the gate holds every round to its accuracy) and how many rounds deep this model is."""
    prior = (read_block(model_in) or {}).get("lineage") or {}
    return {"base": prior.get("base", str(model_in)), "rounds": int(prior.get("rounds", 0)) + 1}


def lineage_base(model: str) -> str:
    """The original base model of `model`'s chain: itself unless this project trained it."""
    return ((read_block(model) or {}).get("lineage") or {}).get("base", str(model))


def without_block(config_text: str) -> bytes:
    """`config.json` as the weights see it: the block is about the model, not of it (fingerprints ignore it)."""
    config = json.loads(config_text)
    config.pop(BLOCK_KEY, None)
    return json.dumps(config, sort_keys=True).encode()


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


def crossover_block(crossover: Crossover, device: torch.device | str | None, dtype: str) -> dict:
    return {
        "ar_above_batch": crossover.ar_above_batch,
        "break_even_tpf": round(crossover.break_even_tpf, 4),
        "crossover": asdict(crossover),
        "hardware": hardware_name(device),
        "dtype": dtype,
    }
