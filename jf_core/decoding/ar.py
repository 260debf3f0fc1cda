"""Autoregressive decoding with a KV cache, greedy or sampling (sampling.py): the baseline every speedup is
measured against, and the sampler whose draws the Jacobi decoders reproduce token for token given the same seeds.

Deliberately lean (2D padding mask, one token per forward, finished rows dropped), and timed with the same `Timer`
and `DecodeStats` as the Jacobi decoders, so a ratio between them compares algorithms, not bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from jf_core.decoding.clock import NO_CLOCK, NoClock
from jf_core.decoding.common import (
    DecodeOutput,
    StopTokens,
    TokenSink,
    check_inputs,
    finish,
    left_pad,
    model_device,
)
from jf_core.decoding.kv import attention_layout, cache_kwargs
from jf_core.decoding.reserved_cache import reserved_cache
from jf_core.decoding.sampling import Sampler, Sampling
from jf_core.decoding.stats import DecodeStats, SequenceStats, Timer


@torch.inference_mode()
def ar_decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: StopTokens,
    on_tokens: TokenSink | None = None,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
    clock: NoClock = NO_CLOCK,
) -> DecodeOutput:
    """Greedy (or sampled) AR decoding over a KV cache; `clock` times each step's parts (clock.py's names)."""
    prompts = check_inputs(prompts, max_new_tokens)
    attention_layout(model)  # a recurrent state or ALiBi is refused by name (it would decode wrong, or crash)
    sampler = Sampler(sampling, seeds, len(prompts))
    eos = stop.eos
    device = model_device(model)
    timer = Timer(device)
    stats = [SequenceStats() for _ in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]

    start = timer.now()
    ids, mask = left_pad(prompts, stop.pad, device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = reserved_cache(model.config, room=ids.shape[1] + max_new_tokens)  # its final length: one buffer
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache)).logits
    active = list(range(len(prompts)))
    nxt = sampler.pick(logits[:, -1:], active, torch.zeros_like(ids[:, :1]))[:, 0]  # output position 0
    prefilled = timer.now()

    forwards = 0
    while True:
        with clock.part("verify"):  # AR's bookkeeping: each row's token appended, finished rows dropped
            keep = []
            for row, (i, tok) in enumerate(zip(active, nxt.tolist(), strict=False)):
                before = len(outputs[i])
                outputs[i], done = finish(outputs[i] + [tok], eos, max_new_tokens)
                stats[i].new_tokens = len(outputs[i])
                if on_tokens is not None and len(outputs[i]) > before:
                    on_tokens(i, outputs[i][before:])
                if not done:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(active):
                rows = torch.tensor(keep, device=device)
                cache.batch_select_indices(rows)
                mask, positions, nxt = mask[rows], positions[rows], nxt[rows]
                active = [active[r] for r in keep]
        with clock.part("tensors"):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
        with clock.part("forward"):
            logits = model(
                input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache)
            ).logits
        with clock.part("pick"):
            # Every active row has the same output length: this forward predicts output position forwards + 1.
            nxt = sampler.pick(logits[:, -1:], active, torch.full_like(positions, forwards + 1))[:, 0]
        clock.cycle(len(active))
        forwards += 1
        for i in active:
            stats[i].forwards += 1
            stats[i].accepted.append(1)
    end = timer.now()
    return DecodeOutput(
        sequences=outputs,
        stats=DecodeStats(
            sequences=stats,
            prefill_seconds=prefilled - start,
            decode_seconds=end - prefilled,
            batch_forwards=forwards,
            ar_sequences=len(stats),
        ),
    )
