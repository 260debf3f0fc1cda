"""A batched KV cache whose rows may hold different numbers of valid slots.

Rows of a Jacobi batch accept different numbers of tokens per forward. Instead of copying caches to keep every row
contiguous, each row keeps a boolean mask of which cache slots are live; queries attend only to live slots and
positions come from the live count, so a row's logits are exactly those of its own unpadded sequence. Rejected
draft slots become dead slots ("holes"); trailing slots dead in every row are cropped at once and `compact()`
squeezes holes out when they waste too much.

Masks, per attention backend:
- SDPA and eager get a ready 4D mask built here, in a handful of tensor ops (the backend's generic builder costs a
  measurable share of a small model's step). Sliding-window layers get the window applied in position space
  (`key position > query position - window`, transformers' own rule), as a per-layer-type dict for hybrid models.
- Backends that take only 2D padding masks (flash-attention and its kin) get `[live cache slots | live window
  slots]`. transformers unpads by that mask, so holes anywhere in the cache and ragged windows (live prefix, padded
  tail) are exact: each row's live keys are its tokens in order, and causal attention aligned at the bottom right
  (flash's rule) lets window query i see exactly its row's cache plus window slots 0..i, with any sliding window
  counted over the same compacted keys. Only a tree layout (recycled branches beside the window) cannot be said in
  2D: that forward runs on SDPA (eager where a model has no SDPA), whatever the model was loaded with.
The cache is plain full layers (no sliding truncation: slots are indexed), whatever the model's layer types.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from jf_core import pins
from jf_core.decoding.backends import attention_backend, attention_implementation
from jf_core.decoding.grouped_attention import GROUPED_SDPA
from jf_core.decoding.reserved_cache import reserved_cache

pins.require("transformers-model")  # the model's backend, cache support and SDPA support are private names

FOUR_D_BACKENDS = ("sdpa", GROUPED_SDPA, "eager")
SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention", "dummy"}  # dummy: MoE/MLP-only layers
RECURRENT_LAYER_TYPES = {"linear_attention", "conv", "hybrid", "hybrid_sliding"}  # a recurrent or conv state


class UnsupportedModelError(ValueError):
    """A model whose attention or cache the exact decoders cannot run (named in the message)."""


@dataclass(frozen=True)
class AttentionLayout:
    """Which attention windows a model's layers use: {layer type: window or None (full)}; one entry for a model
    whose attention layers all look alike."""

    windows: dict[str, int | None]

    @property
    def hybrid(self) -> bool:
        return len(self.windows) > 1

    @property
    def max_window(self) -> int | None:
        sizes = [w for w in self.windows.values() if w is not None]
        return max(sizes) if sizes else None


@functools.lru_cache(maxsize=64)
def _cache_kwarg_name(model_class: type) -> str:
    import inspect

    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """The forward's cache argument under the name this model class takes: `cache` where transformers renamed it
    (passing `past_key_values` there warns on every forward and stops working in transformers 5.40), else
    `past_key_values` (models not yet converted)."""
    return {_cache_kwarg_name(type(model)): cache, "use_cache": True}


def uses_alibi(config) -> bool:
    """ALiBi position biases (BLOOM; Falcon with alibi=True, MPT): built inside transformers from a 2D padding mask."""
    return bool(getattr(config, "alibi", False)) or config.model_type in ("bloom", "mpt")


def attention_layout(model: torch.nn.Module) -> AttentionLayout:
    """The model's attention layout from transformers' own per-layer reading of its config; raises
    UnsupportedModelError for recurrent state, chunked, linear or compressed attention, and for ALiBi positions."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config
    name = type(model).__name__
    text_config = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text_config)
    # transformers' own two readings (5.25 dropped `_is_stateful`, which said both): a model that cannot take a
    # DynamicCache (RWKV, xLSTM: layers that look like full attention; the method is absent without generate()),
    # and layers whose cache is a recurrent state (Mamba, the hybrids).
    takes_cache = getattr(model, "_supports_default_dynamic_cache", None)
    recurrent = sorted(set(types) & RECURRENT_LAYER_TYPES)
    if recurrent or (takes_cache is not None and not takes_cache()):
        where = f"in its {', '.join(recurrent)} layers" if recurrent else "in a cache of its own"
        raise UnsupportedModelError(
            f"{name} keeps a recurrent state {where}, not a per-slot KV cache: Jacobi decoding needs to drop "
            "rejected draft tokens from the cache, which a recurrent state cannot do (and our AR baseline runs on "
            "the same per-slot KV cache, so it refuses the model too rather than decode it wrong)"
        )
    if uses_alibi(text_config):
        raise UnsupportedModelError(
            f"{name} uses ALiBi position biases, which transformers derives from a 2D padding mask: the exact "
            "decoders give every query its position and a 4D mask over a cache with holes, which ALiBi cannot take"
        )
    unknown = sorted(set(types) - SUPPORTED_LAYER_TYPES)
    if unknown:
        raise UnsupportedModelError(
            f"{name} has {', '.join(unknown)} layers; the exact decoders support full and sliding-window attention "
            "only (a draft's rejected tokens must be droppable from every layer's cache)"
        )
    if isinstance(kwargs, dict):  # transformers 5.17 gives one dict for all layers, 5.24 one per layer
        kwargs = [kwargs if t == "sliding_attention" else {} for t in types]
    windows = {t: kw.get("sliding_window") for t, kw in zip(types, kwargs, strict=True) if t != "dummy"}
    if len(set(windows.values())) == 1:  # one kind of attention layer: one mask serves all
        return AttentionLayout({"all": next(iter(windows.values()))})
    return AttentionLayout(windows)


# Window masks by width, built once per process: the hot path would otherwise allocate them every forward. Never
# written to (every use combines them into new tensors).
@functools.lru_cache(maxsize=512)
def _causal(width: int, device: torch.device) -> torch.Tensor:
    return torch.tril(torch.ones(width, width, dtype=torch.bool, device=device))


@functools.lru_cache(maxsize=512)
def _own(width: int, device: torch.device) -> torch.Tensor:
    return torch.eye(width, dtype=torch.bool, device=device)


class KVState:
    def __init__(self, model: torch.nn.Module, cache: DynamicCache, valid: torch.Tensor) -> None:
        self.model = model
        self.cache = cache
        self.valid = valid  # [B, S] bool: slot s of row b holds a live token
        self._pending = 0  # slots appended by the last forward and not yet settled by keep()
        self.backend = attention_implementation(model) or "sdpa"
        self.takes_4d = self.backend in FOUR_D_BACKENDS
        # Where a 2D-only backend cannot run a layout (trees): SDPA, or eager for models without SDPA support.
        self.fallback = "sdpa" if getattr(model, "_supports_sdpa", True) else "eager"
        self.layout = attention_layout(model)
        self.forwards: Counter[str] = Counter()  # per mask path: "4d", "2d", "fallback"
        # Whether any layer slides at all (most models: none, and then no key positions are needed).
        self._sliding = any(w is not None for w in self.layout.windows.values())

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def lengths(self) -> torch.Tensor:
        """Live tokens per row: also the position id of each row's next token."""
        return self.valid.sum(dim=1)

    @classmethod
    def prefill(
        cls, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[KVState, torch.Tensor]:
        """Run left-padded prompts; return the state and the logits at each row's last prompt token ([B, V])."""
        valid = attention_mask.bool()
        cache = reserved_cache()  # full layers only, even for sliding-window models: KVState indexes slots
        state = cls(model, cache, valid[:, :0])
        width = input_ids.shape[1]
        rel = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
        if not state.takes_4d:  # left padding is what a 2D padding mask says
            logits = state._call(input_ids, rel, attention_mask.long(), "2d")
        else:
            causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=input_ids.device))
            logits = state._run(input_ids, rel, causal.expand(len(input_ids), width, width), valid)
        state.keep(valid)
        return state, logits[:, -1]

    def forward(
        self, tokens: torch.Tensor, rel_pos: torch.Tensor | None = None, window_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append a window per row and return its logits [B, W, V].

        tokens: [B, W]. Without `rel_pos` and `window_mask` each row's window is a plain causal run (the Jacobi
        window; the decoding hot path). Otherwise rel_pos [B, W]: window position j of row b gets position id
        lengths[b] + rel_pos[b, j]; window_mask [B, W, W] bool: which window slots each window query may see (a
        tree). The new slots stay pending until `keep()` says which of them are live."""
        if self._pending:
            raise RuntimeError("KVState.forward called twice without keep(): the previous window is unsettled")
        if (rel_pos is None) != (window_mask is None):
            raise ValueError("KVState.forward takes rel_pos and window_mask together, or neither (a causal window)")
        batch, width = tokens.shape
        if window_mask is None:
            if not self.takes_4d:
                return self.forward_causal(tokens, torch.ones_like(tokens, dtype=torch.bool))
            rel_pos = torch.arange(width, device=tokens.device).expand(batch, width)
            window_mask = _causal(width, tokens.device).expand(batch, width, width)
        return self._run(tokens, rel_pos, window_mask, None)

    def forward_causal(self, tokens: torch.Tensor, query_live: torch.Tensor) -> torch.Tensor:
        """Windows that are plain causal runs, each row's live slots first (`query_live` [B, W]: a live prefix per
        row, padding after it). The Jacobi hot path: 2D masks where the backend takes only those."""
        batch, width = tokens.shape
        positions = self.lengths[:, None] + torch.arange(width, device=tokens.device)
        if not self.takes_4d:
            return self._call(tokens, positions, torch.cat([self.valid, query_live], dim=1).long(), "2d")
        causal = _causal(width, tokens.device).expand(batch, width, width)
        return self._run(tokens, positions - self.lengths[:, None], causal, query_live)

    def _run(
        self, tokens: torch.Tensor, rel_pos: torch.Tensor, window_mask: torch.Tensor, query_live: torch.Tensor | None
    ) -> torch.Tensor:
        """A 4D mask for any layout: the backend's own when it takes 4D, else the fallback's for this forward.
        `query_live` None: every window slot is live."""
        batch, width = tokens.shape
        own = _own(width, tokens.device)
        # A query that may see nothing would make softmax produce NaN; padding queries therefore see themselves.
        window = window_mask if query_live is None else window_mask & query_live[:, None, :]
        window = window | own
        mask = torch.cat([self.valid[:, None, :].expand(batch, width, self.slots), window], dim=-1)
        positions = self.lengths[:, None] + rel_pos
        masks = self._windowed(mask, positions)
        if self.takes_4d:
            return self._call(tokens, positions, masks, "4d", additive=self.backend == "eager")
        with attention_backend(self.model, self.fallback):
            return self._call(tokens, positions, masks, "fallback", additive=self.fallback == "eager")

    def _windowed(self, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """[B, 1, W, S+W] mask(s): sliding-window layers see keys with position > query position - window."""
        if not self._sliding:
            return mask[:, None]
        out: dict[str, torch.Tensor] = {}
        slot_pos = torch.cumsum(self.valid.long(), dim=1) - 1  # a live slot's position; dead slots are masked anyway
        key_pos = torch.cat([slot_pos, positions], dim=1)
        for layer_type, size in self.layout.windows.items():
            if size is None or int(positions.max()) < size:  # no key can be out of any query's window yet
                out[layer_type] = mask[:, None]
            else:
                out[layer_type] = (mask & (key_pos[:, None, :] > positions[:, :, None] - size))[:, None]
        return out.get("all", out)

    def _call(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask, path: str, *, additive: bool = False
    ) -> torch.Tensor:
        if additive:  # eager adds the mask to the scores: it needs 0 / -inf, not bools
            mask = {k: self._additive(m) for k, m in mask.items()} if isinstance(mask, dict) else self._additive(mask)
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            attention_mask=mask,
            **cache_kwargs(self.model, self.cache),
        )
        self._pending = tokens.shape[1]
        self.forwards[path] += 1
        return out.logits

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    def keep(self, live: torch.Tensor, width: int | None = None) -> None:
        """Settle the last forward's window: `live` [B, W] marks the slots that hold accepted tokens; `width`, when
        the caller knows it, is 1 + the last slot live in any row (it saves a device sync).

        Trailing slots that no row keeps are cropped from the cache."""
        if live.shape != (self.batch_size, self._pending):
            raise ValueError(f"keep() expects a [{self.batch_size}, {self._pending}] mask, got {tuple(live.shape)}")
        # Invariant: the last slot is live in some row (every keep/compact crops trailing dead slots), so only the
        # new window can end in slots dead in every row.
        if width is None:
            used = live.any(dim=0).nonzero()
            width = int(used.max()) + 1 if len(used) else 0
        if width < self._pending:
            self.cache.crop(width - self._pending)
        self.valid = torch.cat([self.valid, live[:, :width].bool()], dim=1)
        self._pending = 0

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (e.g. drop finished sequences); then drop slots dead in every remaining row."""
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.compact(min_waste=0.0, only_common=True)

    @property
    def waste(self) -> float:
        """Fraction of cache slots that are dead."""
        return 1.0 - float(self.valid.float().mean()) if self.slots else 0.0

    def compact(self, min_waste: float = 0.5, only_common: bool = False) -> None:
        """Gather live slots to the right of each row so holes stop costing memory and attention time.

        Does nothing while the waste is below `min_waste`. With `only_common`, only slots dead in every row are
        dropped (no per-row reordering)."""
        if self._pending:
            raise RuntimeError("compact() while a window is pending")
        if self.slots == 0 or self.waste <= min_waste:
            return
        if only_common:
            index = self.valid.any(dim=0).nonzero().squeeze(1)
            if len(index) == self.slots:
                return
            gather = index[None].expand(self.batch_size, -1)
            new_valid = self.valid[:, index]
        else:
            width = int(self.lengths.max())
            # Sorting the live flags (stable) moves each row's live slots to its end, in their original order.
            order = torch.sort(self.valid.long(), dim=1, stable=True).indices
            gather = order[:, self.slots - width :]
            new_valid = torch.gather(self.valid, 1, gather)
        for layer in self.cache.layers:
            idx = gather[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, idx)
            layer.values = torch.gather(layer.values, 2, idx)
        self.valid = new_valid
