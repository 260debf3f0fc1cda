"""A draft adapter's context kept from one visit of an example to the next (`training.context_memory_mb`).

In the spans layout (spans.py) an example's context is its prompt and clean answer as one causal text, the same on
every visit (only the noisy spans are drawn again), and under a draft adapter the frozen base computes it. So its
keys, values and final hidden states are the same tensors each time the example is seen: the first visit computes
them (without autograd, alone), later visits read them back, and the step computes only the spans, each over its
example's stored context. A GSM8K example's context is about 183 of its 199 positions at a 3-slot span.

The store holds each example's tensors as its first visit computed them, in the compute dtype that visit ran in, so
a step with the store is the step without it to rounding (tests/jf_core/training/test_context_store.py). Memory is
bounded: contexts are kept as they come until the next one would pass `limit_bytes`; after that an example not kept
is computed on each visit, and nothing kept is dropped. A SmolLM2-135M position keeps 30 layers of 3 key-value heads
of 64 and the hidden state: 48 KB in fp32, 36 KB under bf16 autocast (the values bf16, the keys after the rotary
embedding and the final norm's hidden fp32). In bf16 a GSM8K example's context takes about 6.7 MB at 96-token answers
(183 positions: 2,048 questions about 14 GB of this machine's 24) and 10.4 MB at the profile's 256 (283 positions: its
1,024 questions about 11 GB).

Why no eviction: training visits its examples in shuffled epochs (jf_data.batch_orders), so the example seen
longest ago is no less likely to come next than the one just seen. A store with room for a share s of the examples
that drops the least recently seen keeps the last ones visited, and a later epoch, in a new order, reaches most of
them only after they were dropped: about s^2 / 2 of its visits hit, against s for a store that keeps what it has.
Replayed on real runs' visits (bench/context_store_hits.py): the profile's round, 1,024 examples with room for 39%,
233 hits in 1,600 visits against 105; 2,048 examples with room for 61% over 2,680 steps, 2,039 against 1,038, each
hit a context pass of about 0.3 s not run; a run trained under this rule logged its replay's count exactly (2,044,
seed 1). Where every context fits, the two are the same.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from jf_core.decoding.kv import cache_kwargs
from jf_core.training.head import hidden_states_at_head


@dataclass(frozen=True)
class Context:
    """One example's context as the base computed it: per layer keys and values [heads, L, dim], hidden [L, H]."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys, *self.values, self.hidden))

    def __len__(self) -> int:
        return self.hidden.shape[0]


class ContextStore:
    """Examples' contexts by example index, each kept from its first visit while `limit_bytes` has room for it."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.entries: dict[int, Context] = {}
        self.bytes = 0
        self.hits = self.misses = 0
        self.miss_seconds = 0.0  # spent computing contexts: beside a step's time, what the store saves and costs

    def get(self, model: torch.nn.Module, example: int, ids: torch.Tensor, positions: torch.Tensor) -> Context:
        """Example `example`'s context: `ids` and `positions` [L], a causal text run by the base (stored, or computed
        now and stored)."""
        found = self.entries.get(example)
        if found is not None:
            if len(found) != ids.shape[0]:  # an example's context never changes: the index names another example
                raise ValueError(
                    f"example {example}'s kept context has {len(found)} positions, this visit's {ids.shape[0]}: "
                    "a store serves one stream of examples (one objective per run)"
                )
            self.hits += 1
            return found
        self.misses += 1
        start = time.perf_counter()
        context = self.keep(example, _computed(model, ids, positions))
        self.miss_seconds += time.perf_counter() - start
        return context

    def keep(self, example: int, context: Context) -> Context:
        """`context`, kept for `example` (copied into a mapping of its own) if it fits beside what is kept; else
        returned as it is, nothing dropped for it (the module's Why)."""
        if self.bytes + context.nbytes > self.limit_bytes:
            return context
        context = in_own_mapping(context)
        self.entries[example] = context
        self.bytes += context.nbytes
        return context

    def figures(self) -> dict[str, float]:
        """Since the run began: visits that found their context and visits that computed it (with the seconds
        that took), and the MB kept now. Logged with each step's metrics, so a run's hit rate and the context
        passes' share of its step time are read off its history (the 2,048-question run's step slowed from 1.46
        to 2.2-3.4 s as its store filled, and nothing then said why)."""
        return {
            "context_hits": float(self.hits),
            "context_misses": float(self.misses),
            "context_miss_s": self.miss_seconds,
            "context_kept_mb": self.bytes / 2**20,
        }


def _computed(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> Context:
    cache = DynamicCache()
    causal = torch.ones(ids.shape[0], ids.shape[0], dtype=torch.bool, device=ids.device).tril()
    with torch.no_grad(), hidden_states_at_head(model) as seen:
        model(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=causal[None, None],
            **cache_kwargs(model, cache),
        )
    layers = cache.layers
    return Context(
        keys=tuple(layer.keys[0] for layer in layers),
        values=tuple(layer.values[0] for layer in layers),
        hidden=seen["hidden"][0],
    )


_ALIGN = 64  # bytes: each tensor in a mapping starts where a freshly allocated one would (torch aligns to 64)


def in_own_mapping(context: Context) -> Context:
    """`context` on the CPU copied into one anonymous memory mapping of its own, its tensors views of it.

    Why: a kept context lives for hundreds of steps and is 61 tensors of about 140 KB (SmolLM2); left to malloc, those
    long-lived blocks sit in its heap between each step's short-lived tensors, and the fragmented heap made the whole
    step slower as the store filled (400 questions, 2,000 MB, 300 steps: the step outside the context passes went from
    2.09 to 2.48 s, while a fresh process resumed from the last checkpoint ran it in 1.74-1.93 s; with a mapping per
    context it no longer climbed after step 100 (1.55-1.92 s; docs/training.md). One mapping per context keeps the
    heap to the step's own tensors, and dropping the context returns its memory to the system whole."""
    parts = (*context.keys, *context.values, context.hidden)
    if context.hidden.device.type != "cpu":
        return context  # a GPU's caching allocator keeps its own pools (and a meta tensor has no memory to place)
    offsets, at = [], 0
    for t in parts:
        offsets.append(at)
        at += -(-t.nbytes // _ALIGN) * _ALIGN
    raw = torch.frombuffer(mmap.mmap(-1, at), dtype=torch.uint8)
    views = []
    for t, offset in zip(parts, offsets, strict=True):
        view = raw[offset : offset + t.nbytes].view(t.dtype).view(t.shape)
        views.append(view.copy_(t))
    n = len(context.keys)
    return Context(keys=tuple(views[:n]), values=tuple(views[n : 2 * n]), hidden=views[-1])


def batch_cache(contexts: list[Context], width: int) -> tuple[DynamicCache, torch.Tensor]:
    """(a cache holding each row's first `width` context positions, their hidden states [B, width, H])."""
    cache = DynamicCache()
    for layer, _ in enumerate(contexts[0].keys):
        keys = torch.stack([c.keys[layer][:, :width] for c in contexts])
        values = torch.stack([c.values[layer][:, :width] for c in contexts])
        cache.update(keys, values, layer)
    return cache, torch.stack([c.hidden[:width] for c in contexts])
