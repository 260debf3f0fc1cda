"""Linear layers on a CPU by oneDNN, their weights packed once into its blocked layout (decoding only).

`F.linear` on a CPU goes to MKL, whose kernels for a few rows are slow on the AMD EPYC this project runs on: one row
(an AR step) is a matrix-vector product that reads the weights at half the memory speed oneDNN reaches, and 2 to 64
rows (a Jacobi window) take a path up to 3x slower than one row. oneDNN with the weight reordered once for it
(what torch.compile's CPU backend does when it freezes a model) was faster at every width measured: a SmolLM2-135M
forward over a 200-token cache took 44.6 ms for one token against MKL's 63.0, 45.1 for 4 against 89.0 and 59.8 for
16 against 93.9 (2026-11-30, 2 threads, `bench/packed_linear.py`). AR itself gets faster, and a window's forward
costs fewer AR steps, for every decoder alike (they share the model).

Only where nothing needs a gradient, in fp32, on plain CPU tensors: training, bf16 and sharded (DTensor) weights keep
`F.linear`. The packed copy is made on the first such forward (a training process that asks a gradient of every
product never pays for it), costs one more copy of the weights, and is made again whenever the weight changed in
place since (an optimizer step, a loaded state dict). The values are F.linear's to fp32 rounding, not bit for bit;
greedy decoding compares a decoder with AR on the same model, so both run the same kernels.

Under training's CPU autocast a frozen weight (the base under a draft adapter) is cast once and kept (`CastWeight`)
instead of on every product: the same values autocast's cast gives, bit for bit. Autocast is obeyed where no
gradient is needed too: a draft adapter's context pass (jf_core/training/context_cache.py) runs in the compute
dtype like the rest of its step, where the packed fp32 path used to take it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from jf_core import pins

_OPS = torch.ops.mkldnn
# Private ops, pinned to the torch they were written against (jf_core/pins.py): on another, layers keep F.linear.
AVAILABLE = torch.backends.mkldnn.is_available() and pins.require("torch-packed")
_switch = {"on": True, "cast": True}
_PLAIN = (torch.Tensor, nn.Parameter)


@contextlib.contextmanager
def switched_off(switches: dict[str, bool], name: str) -> Iterator[None]:
    """`switches[name]` False meanwhile (a bench's "before" form), restored after."""
    previous, switches[name] = switches[name], False
    try:
        yield
    finally:
        switches[name] = previous


def stamp(*tensors: torch.Tensor) -> tuple:
    """What a cache of tensors derived from `tensors` is keyed by: each one's storage and in-place write count (a
    tensor made under inference_mode keeps no version counter and is written in place by no optimizer)."""
    return tuple((t.data_ptr(), -1 if t.is_inference() else t._version) for t in tensors)


def unpacked() -> contextlib.AbstractContextManager:
    """Every packed layer on `F.linear` meanwhile: what packing saves is measured against it (bench/packed_linear)."""
    return switched_off(_switch, "on")


def packable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this product runs packed: no gradient, fp32, plain CPU tensors, no autocast asking another dtype
    (training's no-grad context pass under bf16 compute runs in bf16 like the rest of its step). Asked of every
    projection in every forward, so each test is the cheapest that decides it: `type(weight)`, not `weight.data`'s
    type (a new tensor each call), `is_cpu`, not `device.type` (a new device object)."""
    return (
        AVAILABLE
        and _switch["on"]
        and not torch.is_grad_enabled()
        and x.dtype is torch.float32
        and weight.dtype is torch.float32
        and x.is_cpu
        and weight.is_cpu  # not meta
        and type(weight) in _PLAIN  # not a DTensor shard (a parameter of a tensor subclass keeps its type)
        and (not _switch["cast"] or not torch.is_autocast_enabled("cpu"))
    )


class PackedWeight:
    """A weight's packed copy (of several stacked by rows: one product for them all), remade when a weight is
    another tensor or was written in place since."""

    def __init__(self) -> None:
        self._packed: torch.Tensor | None = None
        self._stamp: tuple | None = None

    def of(self, *weights: torch.Tensor) -> torch.Tensor:
        now = stamp(*weights)
        if self._stamp != now:
            stacked = torch.cat([w.detach() for w in weights]) if len(weights) > 1 else weights[0].detach()
            self._packed = _OPS._reorder_linear_weight(stacked, None)
            self._stamp = now
        return self._packed

    def linear(self, x: torch.Tensor, weight: torch.Tensor | tuple, bias: torch.Tensor | None) -> torch.Tensor:
        packed = self.of(*weight) if isinstance(weight, tuple) else self.of(weight)
        return _OPS._linear_pointwise(x, packed, bias, "none", [], "")

    def __getstate__(self) -> dict:
        return {"_packed": None, "_stamp": None}  # oneDNN tensors neither pickle nor deep-copy: remade on use


def cast_cached(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this product runs on a kept low-precision copy of a frozen weight: under CPU autocast (training's
    bf16 compute), a weight no gradient is asked of, a plain CPU tensor. Autocast keeps its casts only of leaf
    weights that require grad, so a frozen base under a draft adapter was cast anew in every forward and every
    backward's recomputation: a copy of every projection's weight each time. Products with no gradient at all
    (training's context pass) take this path too, in autocast's dtype, rather than the packed fp32 one."""
    return (
        _switch["cast"]
        and torch.is_autocast_enabled("cpu")
        and not weight.requires_grad
        and x.device.type == "cpu"
        and type(weight.data) is torch.Tensor
        and weight.dtype != torch.get_autocast_dtype("cpu")
    )


def uncached_casts() -> contextlib.AbstractContextManager:
    """Products under autocast as they ran before `CastWeight` meanwhile: frozen weights cast by autocast on every
    product, and no-grad fp32 products packed in fp32 whatever autocast asks; what the change saves is measured
    against it (bench/loss_terms.py)."""
    return switched_off(_switch, "cast")


class CastWeight:
    """A frozen weight's copy in autocast's dtype (of several stacked by rows: one product for them all), remade when
    a weight is another tensor, was written in place since (a loaded state dict), or autocast's dtype changed: the
    same values autocast's own cast gives."""

    def __init__(self) -> None:
        self._cast: torch.Tensor | None = None
        self._stamp: tuple | None = None

    def of(self, dtype: torch.dtype, *weights: torch.Tensor) -> torch.Tensor:
        now = (*stamp(*weights), dtype)
        if self._stamp != now:
            self._cast = (
                torch.cat([w.detach().to(dtype) for w in weights])
                if len(weights) > 1
                else weights[0].detach().to(dtype)
            )
            self._stamp = now
        return self._cast

    def linear(self, x: torch.Tensor, weight: torch.Tensor | tuple, bias: torch.Tensor | None) -> torch.Tensor:
        """`x`'s product with the weight (or the stacked weights) in autocast's dtype; `x` may be in it already."""
        dtype = torch.get_autocast_dtype("cpu")
        weights = weight if isinstance(weight, tuple) else (weight,)
        with torch.autocast("cpu", enabled=False):
            return nn.functional.linear(x.to(dtype), self.of(dtype, *weights), None if bias is None else bias.to(dtype))

    def __getstate__(self) -> dict:
        return {"_cast": None, "_stamp": None}  # a cache: deep copies and pickles start without it


class PackedLinear(nn.Linear):
    """An `nn.Linear` (the same parameters, state dict and hooks) whose no-gradient fp32 CPU forward is packed.

    While a draft adapter acts (draft_adapter/adapter.py `hook`), `draft` names it and this layer's key in it, and
    the layer adds the adapter's delta itself rather than through a forward hook: on the packed path from the As and
    Bs the adapter keeps as its products read them (`DraftAdapter.fused`, by lora.py's `add_kept_delta`)."""

    draft: tuple | None = None  # (adapter, key) while an adapter's gate is set
    siblings = None  # a `siblings.Siblings`: the projections of the same input it runs one product with

    @classmethod
    def of(cls, linear: nn.Linear) -> PackedLinear:
        packed = cls.__new__(cls)
        nn.Module.__init__(packed)
        packed.in_features, packed.out_features = linear.in_features, linear.out_features
        packed.weight, packed.bias = linear.weight, linear.bias  # shared: tying and the state dict are unchanged
        packed.packed_weight = PackedWeight()
        packed.cast_weight = CastWeight()
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        draft = self.draft
        if packable(x, self.weight):
            if self.siblings is not None and (y := self.siblings.output(self, x)) is not None:
                return y
            y = self.packed_weight.linear(x, self.weight, self.bias)
            return y if draft is None else draft[0].fused((draft[1],), x, y)
        if cast_cached(x, self.weight):
            if self.siblings is not None and (y := self.siblings.cast_output(self, x)) is not None:
                return y
            y = self.cast_weight.linear(x, self.weight, self.bias)
        else:
            y = nn.functional.linear(x, self.weight, self.bias)
        return y if draft is None else draft[0].add(draft[1], x, y)


# Packing pays where the weights stream from memory, not where they sit in a cache: on a model small enough to stay
# cached (the embedded default: 3 MB) one oneDNN call cost 18-36 us against MKL's 3-9 us, row counts 1 and 16, for
# every layer shape it has (2026-11-30, 2 threads). Below this many bytes of linear weights a model is not packed.
MIN_PACKED_BYTES = 64 * 2**20


def pack_linears(model: nn.Module, min_bytes: int | None = None) -> int:
    """Swap every plain `nn.Linear` of `model` for a `PackedLinear` over the same parameters, when their weights
    come to `min_bytes` (default `MIN_PACKED_BYTES`) or more; returns how many were swapped."""
    linears = [(name, mod) for name, mod in model.named_modules() if type(mod) is nn.Linear]
    size = sum(mod.weight.numel() * mod.weight.element_size() for _, mod in linears)
    if not AVAILABLE or size < (MIN_PACKED_BYTES if min_bytes is None else min_bytes):
        return 0
    swapped = [name for name, _ in linears]
    for name in swapped:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, PackedLinear.of(getattr(owner, attr)))
    return len(swapped)
