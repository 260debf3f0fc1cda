"""Projections of one input run as one product: a layer's q, k and v, and its gate and up (packed, in decoding; cast
once to the compute dtype, in a draft adapter's training).

At decoding's few rows a oneDNN call costs this CPU tens of microseconds beyond its arithmetic, and SmolLM2's 30
layers make 210 of them a forward (a draft adapter acting adds its own products to each); grouped, q, k and v are
one call and gate and up one, 90 calls fewer a forward, and an adapter's delta is one product of the group's As and
one addmm of its Bs a group (`lora.add_kept_delta`).

Without touching the model's code: the members share a `Siblings`; the first member called with an input runs the
group's product and keeps every member's output for that input (the same tensor, unchanged since); each other
member called with it takes its own slice. A member called with another input (a model that feeds its projections
different tensors) runs alone, as it would ungrouped; so does a group whose members an adapter acts on unevenly.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from jf_core.layers.packed import CastWeight, PackedLinear, PackedWeight, stamp, switched_off

NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # the projections models feed one input
_switch = {"on": True}


def ungrouped() -> contextlib.AbstractContextManager:
    """Every member on its own product meanwhile: what grouping saves is measured against it."""
    return switched_off(_switch, "on")


class Siblings:
    """Packed projections of one input (`NAMES`), run as one product on the packed path."""

    def __init__(self, members: list[PackedLinear]) -> None:
        self.members = members
        self.sizes = [m.out_features for m in members]
        self.packed = PackedWeight()  # the members' weights stacked (their biases concatenated)
        self.cast = CastWeight()  # the same stack in training's autocast dtype (frozen members)
        self._bias: tuple[tuple, torch.Tensor | None] | None = None
        self._held: list | None = None  # [input, its stamp, the gate's weights, outputs, members still to serve]

    def output(self, member: PackedLinear, x: torch.Tensor) -> torch.Tensor | None:
        """`member`'s output of `x` from the group's one packed product, or None where the group does not serve it
        (then the member runs alone)."""
        drafts, adapter = self._drafts()
        if drafts is None:
            return None
        return self._serve(member, x, adapter, lambda: self._product(x, drafts, adapter))

    def cast_output(self, member: PackedLinear, x: torch.Tensor) -> torch.Tensor | None:
        """`member`'s output of `x` under training's autocast (packed.py `cast_cached`): the frozen members' weights
        cast and stacked once, one product for the group, and an adapter's deltas with autograd (`lora.add_siblings
        _delta`: every A one product, the Bs one block-diagonal one). None where the group does not serve it."""
        drafts, adapter = self._drafts()
        if drafts is None or any(m.weight.requires_grad for m in self.members):
            return None
        return self._serve(member, x, adapter, lambda: self._cast_product(x, drafts, adapter))

    def _drafts(self) -> tuple[list | None, object]:
        """(each member's (adapter, key) or None, the adapter acting on them all); (None, None) where grouping is
        off or an adapter acts on the members unevenly."""
        drafts = [m.draft for m in self.members]
        adapter = drafts[0][0] if drafts[0] is not None else None
        if not _switch["on"] or any((d[0] if d is not None else None) is not adapter for d in drafts):
            return None, None
        return drafts, adapter

    def _serve(self, member: PackedLinear, x: torch.Tensor, adapter, product) -> torch.Tensor:
        """`member`'s slice of the group's output for `x`: the first member called with `x` runs `product`, and every
        member's output is kept for the others (the same tensor, unchanged since, under the same gate)."""
        weights = None if adapter is None else adapter._weights
        held = self._held
        if held is None or held[0] is not x or held[1] != stamp(x) or held[2] is not weights:
            outputs = product().split(self.sizes, dim=-1)  # one op for every member's view
            held = self._held = [x, stamp(x), weights, outputs, set(range(len(self.members)))]
        i = self.members.index(member)  # by identity: a module's == is its identity
        held[4].discard(i)
        if not held[4]:
            self._held = None  # every member served: the input is not kept past its forward
        return held[3][i]

    def _product(self, x: torch.Tensor, drafts: list, adapter) -> torch.Tensor:
        y = self.packed.linear(x, tuple(m.weight for m in self.members), self._biases())
        return y if adapter is None else adapter.fused(tuple(d[1] for d in drafts), x, y)

    def _cast_product(self, x: torch.Tensor, drafts: list, adapter) -> torch.Tensor:
        y = self.cast.linear(x, tuple(m.weight for m in self.members), self._biases())
        return y if adapter is None else adapter.add_siblings([d[1] for d in drafts], x, y)

    def _biases(self) -> torch.Tensor | None:
        biases = [m.bias for m in self.members]
        if biases[0] is None:
            return None
        now = stamp(*biases)
        if self._bias is None or self._bias[0] != now:
            self._bias = (now, torch.cat([b.detach() for b in biases]))
        return self._bias[1]

    def __getstate__(self) -> dict:
        # A copy keeps its members and drops what it computed (oneDNN tensors neither pickle nor deep-copy).
        return {**self.__dict__, "packed": PackedWeight(), "cast": CastWeight(), "_bias": None, "_held": None}


def group_siblings(model: nn.Module) -> int:
    """Give each group of packed projections of one input (`NAMES`, under one parent, alike in input width and in
    having a bias) a shared `Siblings`; returns how many groups."""
    groups = 0
    for parent in model.modules():
        for names in NAMES:
            members = [getattr(parent, name, None) for name in names]
            if not all(isinstance(m, PackedLinear) for m in members):
                continue
            if len({m.in_features for m in members}) > 1 or len({m.bias is None for m in members}) > 1:
                continue
            group = Siblings(members)
            for m in members:
                m.siblings = group
            groups += 1
    return groups
