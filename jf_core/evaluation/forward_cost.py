"""What a window costs: the median time of one forward of a window of each width over a KV cache, batch `batch`.

On a GPU a 16- or 32-token window costs about what one token does, so TPF is the speedup. On a CPU (or a large model)
it does not: a Jacobi step at width n pays `cost(n) / cost(1)` AR steps, so plain Jacobi beats AR only where TPF is
above that ratio (the break-even TPF), and adaptive width earns its keep. `jf bench forward` prints both."""

from __future__ import annotations

import statistics
import time

import torch

from jf_core.decoding.kv import cache_kwargs
from jf_core.decoding.reserved_cache import reserved_cache
from jf_core.draft_adapter.adapter import draft_adapter, draft_gate, gated
from jf_core.evaluation.tables import figure


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
    gated_slots: int = 0,
) -> dict:
    """{"ms": {width: median ms}, "ratio_to_width_1": {width: ms / ms at the first width}, ...}; the widths take
    turns rep by rep, so a machine that speeds up or slows down mid-run shifts every width alike. The cache is
    cropped back to `context` after every forward, so every width sees the same context.

    `gated_slots` k > 0 (a model with a draft adapter): each width is also timed with the adapter acting on its
    last k slots (never slot 0: a draft chain's), the two forms taking turns forward by forward and in alternating
    order; "gated_ms" then holds those medians. Their difference is what the adapter's products cost a forward at
    equal width, apart from the chain's slots (issue 69's cost table)."""
    if gated_slots and draft_adapter(model) is None:
        raise ValueError(f"gated_slots={gated_slots}: the model has no draft adapter (draft_adapter.safetensors)")
    device = next(model.parameters()).device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, context), generator=gen).to(device)
    cache = reserved_cache(model.config)  # the decoders' cache: a forward appends in place
    model(input_ids=ids, **cache_kwargs(model, cache))
    forms = [False, True] if gated_slots else [False]
    times: dict[tuple[int, bool], list[float]] = {(w, g): [] for w in widths for g in forms}
    for rep in range(warmup + repeats):
        for w in widths:
            window = torch.randint(3, vocab, (batch, w), generator=gen).to(device)
            positions = torch.arange(context, context + w, device=device).expand(batch, w)
            gate = draft_gate([range(max(1, w - gated_slots), w)] * batch, w, device) if gated_slots else None
            for g in forms if rep % 2 == 0 else forms[::-1]:
                _sync(device)
                t0 = time.perf_counter()
                with gated(model, gate if g else None):
                    model(input_ids=window, position_ids=positions, **cache_kwargs(model, cache))
                _sync(device)
                if rep >= warmup:
                    times[w, g].append(time.perf_counter() - t0)
                cache.crop(-w)  # back to `context` (transformers 5 crops by a negative count)
    ms = {w: 1000 * statistics.median(times[w, False]) for w in widths}
    base = ms[widths[0]]
    out = {
        "ms": ms,
        "ratio_to_width_1": {w: ms[w] / base for w in widths},
        "widest_within_1.5x": max((w for w in widths if ms[w] <= 1.5 * base), default=widths[0]),
        "context": context,
        "batch": batch,
        "threads": torch.get_num_threads(),
    }
    if gated_slots:
        out["gated_slots"] = gated_slots
        out["gated_ms"] = {w: 1000 * statistics.median(times[w, True]) for w in widths}
    return out


def forms_cost(
    model: torch.nn.Module,
    forms: dict,
    widths: list[int],
    *,
    context: int = 200,
    rounds: int = 3,
    repeats: int = 8,
    progress=print,
) -> dict[str, dict[int, list[float]]]:
    """`window_cost` of `model` in each form, the forms taking turns round by round (so a machine that drifts
    mid-run shifts them alike): {form: {width: [ms per round]}}. `forms` maps a name to a zero-argument callable
    returning the context manager that puts the model in that form for a turn."""
    ms: dict[str, dict[int, list[float]]] = {name: {w: [] for w in widths} for name in forms}
    for rnd in range(rounds):
        for name, form in forms.items():
            with form():
                got = window_cost(model, widths, context=context, repeats=repeats, warmup=2, seed=rnd)
            for w, v in got["ms"].items():
                ms[name][w].append(v)
        progress(f"round {rnd + 1}/{rounds} done")
    return ms


def forms_table(
    ms: dict[str, dict[int, list[float]]], ratio: tuple[str, str, str]
) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of two forms' costs (`forms_cost`'s, its form names the column names, in its order): each
    form's median ms per width, `ratio` (numerator form, denominator form, column name), each form's ratio to its
    first width (the break-even TPF), and the spread over rounds."""
    ref, other = ms
    num, den, ratio_label = ratio
    med = {name: {w: statistics.median(v) for w, v in by_w.items()} for name, by_w in ms.items()}
    widths = list(med[ref])
    first = widths[0]
    rows = [
        [
            str(w),
            figure(med[ref][w], 1),
            figure(med[other][w], 1),
            figure(med[num][w] / med[den][w], 2),
            figure(med[ref][w] / med[ref][first], 2),
            figure(med[other][w] / med[other][first], 2),
            " / ".join(f"{figure(min(ms[n][w]), 1)}-{figure(max(ms[n][w]), 1)}" for n in (ref, other)),
        ]
        for w in widths
    ]
    head = ["width", f"{ref} ms", f"{other} ms", ratio_label,
            f"{ref} / width {first}", f"{other} / width {first}",
            f"spread over rounds ({ref} / {other})"]  # fmt: skip
    return head, rows
