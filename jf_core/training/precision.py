"""What training's matmuls run in: `training.compute_dtype` resolved to a torch dtype for the device at hand.

`auto` chooses by measuring, because the answer depends on the CPU and not on its feature flags: on this project's
AMD EPYC (AVX512-BF16) bf16 autocast trained the draft adapter 1.5x faster than fp32, and on an Intel Xeon with the
same AVX512-BF16 flag (no AMX exposed) bf16 matmuls ran at half fp32's rate and the whole step 0.67x
(docs/experiments/adapter-7473-questions.md). A GPU with bf16 takes bf16 without timing (its tensor cores always
win). Either dtype trains the adapter to the same TPF (1.292 against 1.295 held-out at equal tokens), so the choice
is speed alone; the optimizer steps fp32 weights and the model directory keeps the model's dtype either way.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from jf_core.onednn import size_primitive_cache

CHOICES = (torch.float32, torch.bfloat16)


def resolve_compute_dtype(setting: str, model_dtype: torch.dtype, device: torch.device, width: int) -> torch.dtype:
    """`setting` (training.compute_dtype) as a dtype: `model` the model's, `auto` the faster of fp32 and bf16 here
    for a linear layer `width` wide (the model's hidden size), a named dtype itself."""
    if setting == "model":
        return model_dtype
    if setting != "auto":
        return getattr(torch, setting)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    size_primitive_cache()  # the measurement's bf16 products may be the process's first: the capacity is read then
    return faster(linear_seconds(width, device))


def faster(seconds: dict[torch.dtype, float]) -> torch.dtype:
    """The dtype of the least time; fp32 on a tie (bf16 must earn its rounding)."""
    return min(seconds, key=lambda dtype: (seconds[dtype], dtype != torch.float32))


def linear_seconds(width: int, device: torch.device, rows: int = 512, repeats: int = 5) -> dict[torch.dtype, float]:
    """Seconds of one fp32 linear layer [rows, width] x [4 width, width] as training runs it in each dtype: plain
    fp32, and under bf16 autocast, which casts the frozen fp32 weight on every call as a training step does. The
    dtypes take turns and each keeps its fastest repeat, so a neighbour's time slice does not decide."""
    x = torch.randn(rows, width, device=device)
    weight = torch.randn(4 * width, width, device=device)
    best = dict.fromkeys(CHOICES, float("inf"))
    for _ in range(repeats):
        for dtype in CHOICES:
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                start = time.perf_counter()
                F.linear(x, weight)
                best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best
