"""What a window costs: the median time of one forward of a window of each width over a KV cache, batch `batch`.

On a GPU a 16- or 32-token window costs about what one token does, so TPF is the speedup. On a CPU (or a large model)
it does not: a Jacobi step at width n pays `cost(n) / cost(1)` AR steps, so plain Jacobi beats AR only where TPF is
above that ratio (the break-even TPF), and adaptive width earns its keep. `jf bench forward` prints both."""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache

from jf_core.decoding.kv import cache_kwargs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def window_cost(
    model: torch.nn.Module,
    widths: list[int],
    *,
    context: int = 200,
    batch: int = 1,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> dict:
    """{"ms": {width: median ms}, "ratio_to_width_1": {width: ms / ms at the first width}, ...}; the widths take
    turns rep by rep, so a machine that speeds up or slows down mid-run shifts every width alike. The cache is
    cropped back to `context` after every forward, so every width sees the same context."""
    device = next(model.parameters()).device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, context), generator=gen).to(device)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, **cache_kwargs(model, cache))
    times: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(warmup + repeats):
        for w in widths:
            window = torch.randint(3, vocab, (batch, w), generator=gen).to(device)
            positions = torch.arange(context, context + w, device=device).expand(batch, w)
            _sync(device)
            t0 = time.perf_counter()
            model(input_ids=window, position_ids=positions, **cache_kwargs(model, cache))
            _sync(device)
            if rep >= warmup:
                times[w].append(time.perf_counter() - t0)
            cache.crop(-w)  # back to `context` (transformers 5 crops by a negative count)
    ms = {w: 1000 * statistics.median(t) for w, t in times.items()}
    base = ms[widths[0]]
    return {
        "ms": ms,
        "ratio_to_width_1": {w: ms[w] / base for w in widths},
        "widest_within_1.5x": max((w for w in widths if ms[w] <= 1.5 * base), default=widths[0]),
        "context": context,
        "batch": batch,
        "threads": torch.get_num_threads(),
    }
