"""A KV cache that appends in place: each layer's keys and values live in a buffer with room to grow, and the cache
hands attention a view of its filled part.

transformers' `DynamicLayer` concatenates every forward's keys and values onto the whole cache (`torch.cat`), a copy
of every layer's cache per forward: on SmolLM2-135M, greedy AR at batch 64 over 96 new tokens spent 14% of its time
in `cat` on this CPU (2026-12-02, torch's profiler). Here a forward writes its slots into the buffer's free room.
Where the caller knows how long the cache gets (`room`: AR's prompt plus its new tokens) the buffer is made that
long once; otherwise it grows by a quarter when full (`GROWTH`: a copy each time the cache grows by a quarter, not
one per forward, and at most a quarter more memory than the slots held, which `jf plan` counts). Cropping the
rejected drafts' slots (every Jacobi forward) only moves the fill mark. The values attention sees are the same
tensors' values, so every decoder's output is unchanged bit for bit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

GROWTH = 0.25  # a full buffer grows by this share of its room (at least MIN_GROWTH slots)
MIN_GROWTH = 16


def filled(tensor: torch.Tensor | None) -> int:
    """The slots an assigned keys or values tensor holds (transformers' empty placeholder: none)."""
    return 0 if tensor is None or tensor.dim() < 4 else tensor.shape[-2]


class ReservedLayer(DynamicLayer):
    """A full-attention `DynamicLayer` whose `keys`/`values` are views of buffers with free room after them."""

    def __init__(self, room: int = 0, **kwargs) -> None:
        self._room = room  # slots the first buffer holds at least (0: as many as the first forward brings)
        self._keys: torch.Tensor | None = None  # [B, H, capacity, D]
        self._values: torch.Tensor | None = None
        self._length = self._value_length = 0
        super().__init__(**kwargs)

    # `keys` and `values` stay attributes to the rest of transformers (and to KVState.compact): read, they are the
    # filled part; assigned (a batch select, a gather), the assigned tensor becomes the buffer, full. Each keeps its
    # own fill mark: KVState.compact assigns the gathered keys before it reads the values it gathers.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self._length]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys, self._length = tensor, filled(tensor)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self._value_length]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values, self._value_length = tensor, filled(tensor)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._keys = self._values = None
        self._length = self._value_length = 0
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        self._keys[:, :, self._length : end] = key_states
        self._values[:, :, self._length : end] = value_states
        self._length = self._value_length = end
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        """New buffers of `needed` slots or more (the first: the layer's `room`; later ones a quarter more than the
        old), the filled part copied over."""
        old = 0 if self._keys is None else self._keys.shape[-2]
        room = max(needed, self._room if self._keys is None else old + max(int(old * GROWTH), MIN_GROWTH))
        old_keys, old_values, length = self._keys, self._values, self._length
        batch, heads, _, _ = key_states.shape
        self._keys = key_states.new_empty(batch, heads, room, key_states.shape[-1])
        self._values = value_states.new_empty(batch, heads, room, value_states.shape[-1])
        if length:
            self._keys[:, :, :length] = old_keys[:, :, :length]
            self._values[:, :, :length] = old_values[:, :, :length]

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` slots (transformers' convention: a negative count): the fill mark moves
        back, the room stays."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to remove, got {tokens_to_remove}")
        self._length = self._value_length = max(self._length + tokens_to_remove, 0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices`, with their room."""
        if self._keys is not None:
            self._keys, self._values = self._keys[indices], self._values[indices]

    def reset(self) -> None:
        self._keys = self._values = None
        self._length = self._value_length = 0
        self.is_initialized = False


_switch = {"on": True}


@contextlib.contextmanager
def concatenating() -> Iterator[None]:
    """Caches made meanwhile are transformers' concatenating ones: what appending in place saves is measured against
    it (bench/trajectory_speed.py `--caches`)."""
    previous, _switch["on"] = _switch["on"], False
    try:
        yield
    finally:
        _switch["on"] = previous


def reserved_cache(config=None, room: int = 0) -> DynamicCache:
    """A `DynamicCache` whose full-attention layers append in place (`ReservedLayer`), each made `room` slots long
    at first when the caller knows its final length. With `config`, transformers picks each layer's kind (a
    sliding-window layer keeps its own, which truncates); without, every layer is full (what KVState indexes)."""
    if not _switch["on"]:
        return DynamicCache(config=config) if config is not None else DynamicCache()
    if config is None:
        cache = DynamicCache()
        cache.layer_class_to_replicate = functools.partial(ReservedLayer, room)
        return cache
    cache = DynamicCache(config=config)
    cache.layers = [ReservedLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
