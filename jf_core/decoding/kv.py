"""A batched KV cache whose rows may hold different numbers of valid slots.

Rows of a Jacobi batch accept different numbers of tokens per forward. Instead of copying caches to keep every row
contiguous, each row keeps a boolean mask of which cache slots are live; queries attend only to live slots and
positions come from the live count, so a row's logits are exactly those of its own unpadded sequence. Rejected
draft slots become dead slots ("holes"); trailing slots dead in every row are cropped at once and `compact()`
squeezes holes out when they waste too much.

Masks: SDPA and eager get a ready 4D mask built here, in a handful of tensor ops (the backend's generic mask
builder costs a measurable share of a small model's step). Other backends (flash-attention) take only 2D padding
masks: there, when no row has a hole and every window is a plain causal run, the forward passes a 2D mask and the
backend builds the causal part itself.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class KVState:
    def __init__(self, model: torch.nn.Module, cache: DynamicCache, valid: torch.Tensor) -> None:
        self.model = model
        self.cache = cache
        self.valid = valid  # [B, S] bool: slot s of row b holds a live token
        self._pending = 0  # slots appended by the last forward and not yet settled by keep()
        backend = getattr(model.config, "_attn_implementation", None) or "sdpa"
        self._takes_4d = backend in ("sdpa", "eager")
        self._additive = backend == "eager"  # eager adds the mask to the scores: it needs 0 / -inf, not bools

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
        cache = DynamicCache(config=model.config)
        state = cls(model, cache, valid[:, :0])
        width = input_ids.shape[1]
        rel = torch.cumsum(valid.long(), dim=1) - 1
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=input_ids.device))
        logits = state._run(input_ids, rel.clamp(min=0), causal.expand(len(input_ids), width, width), valid)
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
            if not self._takes_4d and bool(self.valid.all()):
                return self._run_contiguous(tokens)
            rel_pos = torch.arange(width, device=tokens.device).expand(batch, width)
            window_mask = torch.tril(torch.ones(width, width, dtype=torch.bool, device=tokens.device))
            window_mask = window_mask.expand(batch, width, width)
        return self._run(tokens, rel_pos, window_mask, torch.ones_like(tokens, dtype=torch.bool))

    def _run_contiguous(self, tokens: torch.Tensor) -> torch.Tensor:
        """No holes and a causal window, on a backend that takes only 2D masks: it builds the causal part itself."""
        batch, width = tokens.shape
        positions = self.lengths[:, None] + torch.arange(width, device=tokens.device)
        mask = torch.ones(batch, self.slots + width, dtype=torch.long, device=tokens.device)
        return self._call(tokens, positions, mask)

    def _run(
        self, tokens: torch.Tensor, rel_pos: torch.Tensor, window_mask: torch.Tensor, query_live: torch.Tensor
    ) -> torch.Tensor:
        batch, width = tokens.shape
        if not self._takes_4d and self._is_contiguous_causal(rel_pos, window_mask, query_live):
            return self._run_contiguous(tokens)
        # A query that may see nothing would make softmax produce NaN; padding queries therefore see themselves.
        own = torch.eye(width, dtype=torch.bool, device=tokens.device)
        window = (window_mask & query_live[:, None, :]) | own
        mask = torch.cat([self.valid[:, None, :].expand(batch, width, self.slots), window], dim=-1)[:, None]
        return self._call(tokens, self.lengths[:, None] + rel_pos, mask)

    def _call(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self._additive and mask.dtype == torch.bool:
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        self._pending = tokens.shape[1]
        return out.logits

    def _is_contiguous_causal(self, rel_pos: torch.Tensor, window_mask: torch.Tensor, query_live: torch.Tensor) -> bool:
        width = rel_pos.shape[1]
        if not bool(self.valid.all()) or not bool(query_live.all()):
            return False
        arange = torch.arange(width, device=rel_pos.device)
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=rel_pos.device))
        return bool((rel_pos == arange).all()) and bool((window_mask == causal).all())

    def keep(self, live: torch.Tensor) -> None:
        """Settle the last forward's window: `live` [B, W] marks the slots that hold accepted tokens.

        Trailing slots that no row keeps are cropped from the cache."""
        if live.shape != (self.batch_size, self._pending):
            raise ValueError(f"keep() expects a [{self.batch_size}, {self._pending}] mask, got {tuple(live.shape)}")
        # Invariant: the last slot is live in some row (every keep/compact crops trailing dead slots), so only the
        # new window can end in slots dead in every row.
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
