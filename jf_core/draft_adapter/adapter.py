"""The draft adapter itself: the module on the model, its gate, and how it is attached, saved and loaded (the
package's docstring says what it is and where it is used)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from jf_core.draft_adapter.config import FILE, TARGETS, DraftLora
from jf_core.layers.blocks import decoder_layers
from jf_core.layers.lora import Run, add_delta, add_kept_delta, add_siblings_delta, kept, single_run
from jf_core.layers.packed import PackedLinear, stamp

ATTRIBUTE = "jf_draft_adapter"


def target_projections(model: nn.Module, config: DraftLora | None = None) -> list[tuple[str, nn.Linear]]:
    """The linear layers an adapter of `config` adds to (None: every projection named in TARGETS, what `jf plan`
    counts without an adapter): those named one of its targets, in the model's last `last_layers` decoder layers
    when given."""
    targets = config.targets if config is not None else TARGETS
    found = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]
    if config is None or config.last_layers is None:
        return found
    try:
        layers = decoder_layers(model)
    except ValueError as err:
        raise ValueError(f"draft_lora.last_layers: {err}") from None
    top = {id(m) for layer in layers[-config.last_layers :] for m in layer.modules()}
    return [(name, mod) for name, mod in found if id(mod) in top]


class DraftAdapter(nn.Module):
    def __init__(self, model: nn.Module, config: DraftLora) -> None:
        super().__init__()
        self.config = config
        self.scale = self.alpha / self.rank  # read by every gated forward: computed once
        self.a = nn.ParameterDict()
        self.b = nn.ParameterDict()
        self.gate: torch.Tensor | None = None  # [B, L]: 1 where the adapter acts, None: the base everywhere
        self._weights: torch.Tensor | None = None  # [B, L, 1]: scale x gate, made once per gate, not per projection
        self._run: Run | None = None  # the gate's one run of rows, where it has one (layers/lora.py `single_run`)
        # Per target or group of targets (`fused`): its As and Bs as the products read them (layers/lora.py `kept`),
        # made on first use and dropped whenever an A or B changed. The first fused product under a gate checks them
        # all at once (`_fused_gate`); checked per product instead, as a packed weight is, they cost a SmolLM2
        # forward about 0.6 ms of its 4-5 ms of adapter, its caches cold from the weights streaming through
        # (2026-12-04). Training's gates, which never take the fused path, never pay for it.
        self._kept: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._kept_stamp: tuple | None = None
        self._gate_read = True  # the fused path has read the current gate (its run, the kept tensors' check)
        # The projections it adds to, as a plain list (not submodules: they belong to the model). Their hooks are
        # registered only while a gate is set (`gated`): a module with hooks takes nn.Module's slow call path, which
        # cost AR several percent of a SmolLM2 step on this CPU with 210 hooked projections.
        self._targets: list[tuple[str, nn.Linear]] = []
        self._handles: list = []
        self._acting = False  # hooked: the targets add the delta while the gate is set
        found = target_projections(model, config)
        if not found:
            raise ValueError(
                f"{type(model).__name__} has no projection named {', '.join(self.targets)}: the draft adapter "
                "knows Llama-family layer names only"
            )
        for name, mod in found:
            key = name.replace(".", "__")
            a = torch.empty(self.rank, mod.in_features, dtype=mod.weight.dtype, device=mod.weight.device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # LoRA's init: A random, B zero, so the adapter starts at 0
            self.a[key] = nn.Parameter(a)
            self.b[key] = nn.Parameter(torch.zeros(mod.out_features, self.rank, dtype=a.dtype, device=a.device))
            self._targets.append((key, mod))

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def alpha(self) -> float:
        return float(self.config.alpha if self.config.alpha is not None else self.config.rank)

    @property
    def targets(self) -> tuple[str, ...]:
        return self.config.targets

    @property
    def last_layers(self) -> int | None:
        return self.config.last_layers

    def set_gate(self, gate: torch.Tensor | None) -> None:
        self.gate = gate
        self._weights = None if gate is None else self.scale * gate[..., None]
        self._gate_read = gate is None

    def add(self, key: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`output` (the projection's, of input `x`) plus the adapter's delta where the gate is set."""
        return add_delta(output, x, self.a[key], self.b[key], self._weights)

    def add_siblings(self, keys: list[str], x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`output` (projections of one input `x`, side by side) plus each one's delta (layers/lora.py
        `add_siblings_delta`): the training path, with autograd."""
        return add_siblings_delta(output, x, [self.a[k] for k in keys], [self.b[k] for k in keys], self._weights)

    def fused(self, keys: tuple[str, ...], x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`output` (the packed product of `x` by the projections `keys` name, side by side: one, or a group's,
        siblings.py) plus each one's delta where the gate is set, without gradients (layers/lora.py
        `add_kept_delta`)."""
        if not self._gate_read:
            self._fused_gate()
        tensors = self._kept.get(keys)
        if tensors is None:
            tensors = self._kept[keys] = kept([self.a[k] for k in keys], [self.b[k] for k in keys])
        return add_kept_delta(output, x, *tensors, self._weights, self._run)

    def _fused_gate(self) -> None:
        """Once a gate, on the fused path: the gate's one run of rows (its fast form) and whether any A or B was
        written in place or replaced since the kept tensors were made (a TPF probe between training steps)."""
        self._gate_read = True
        self._run = single_run(self._weights)
        now = stamp(*self.a.values(), *self.b.values())
        if now != self._kept_stamp:
            self._kept, self._kept_stamp = {}, now

    def _apply(self, fn, recurse: bool = True):
        self._kept, self._kept_stamp = {}, None  # `.to()` and the like may put other tensors in the parameters' place
        return super()._apply(fn, recurse)

    def _hooked(self, key: str, _module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        return None if self.gate is None else self.add(key, args[0], output)

    def hook(self) -> None:
        """Act on the target projections: a packed one (layers/packed.py) adds the delta itself, others by a
        forward hook. Once per gated forward, so the packed layers' `draft` is written into their `__dict__`:
        nn.Module's `__setattr__` checks for parameters, buffers and submodules on every write, and 420 of them
        (hook and unhook, SmolLM2's 210 targets) cost a gated forward about 0.4 ms on this CPU (2026-12-03)."""
        if self._acting:
            return
        self._acting = True
        for key, mod in self._targets:
            if isinstance(mod, PackedLinear):
                mod.__dict__["draft"] = (self, key)
            else:
                self._handles.append(mod.register_forward_hook(functools.partial(self._hooked, key)))

    def unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for _, mod in self._targets:
            if isinstance(mod, PackedLinear):
                mod.__dict__["draft"] = None
        self._acting = False

    def metadata(self) -> dict[str, str]:
        meta = {"rank": str(self.rank), "alpha": repr(self.alpha), "targets": ",".join(self.targets)}
        return meta if self.last_layers is None else {**meta, "last_layers": str(self.last_layers)}


def draft_adapter(model: nn.Module) -> DraftAdapter | None:
    """The model's draft adapter, or None (a plain model: it drafts with the weights that verify)."""
    return getattr(getattr(model, "module", model), ATTRIBUTE, None)


def attach_draft_adapter(model: nn.Module, config: DraftLora) -> DraftAdapter:
    """Freeze `model` and give it a zero-initialised draft adapter (the only trainable weights from here on)."""
    if draft_adapter(model) is not None:
        raise ValueError(f"{type(model).__name__} already has a draft adapter")
    model.requires_grad_(False)
    adapter = DraftAdapter(model, config)
    model.add_module(ATTRIBUTE, adapter)
    return adapter


def for_training(model: nn.Module, config: DraftLora | None) -> DraftAdapter | None:
    """What trains: with `training.draft_lora`, the input model's own adapter when it has one (a later round goes
    on training it) or a new one on the frozen model; None when the whole model trains (and the input model must
    keep no adapter: training it whole would leave a stale adapter drafting beside new weights)."""
    adapter = draft_adapter(model)
    if config is None:
        if adapter is not None:
            raise ValueError(
                "the input model carries a draft adapter (draft_adapter.safetensors): set training.draft_lora to go "
                "on training it, or train a model without one"
            )
        return None
    return adapter or attach_draft_adapter(model, config)


# -- the gate: where the adapter acts, one rule for decoding and training -----------------------------------------


def drafted_slots(chain: Sequence[int], first_drafted: int = 1) -> Sequence[int]:
    """The slots of a drafted block or chain the adapter computes: from its first drafted slot on, never its root
    (slot 0: the token the base committed or would commit, which the KV cache holds). Training's noisy block starts
    drafting where it first departs from the fixed point; the decoder's draft chain at slot 1."""
    return chain[max(first_drafted, 1) :]


def draft_gate(rows: Sequence[Iterable[int]], width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[B, width]: 1 on each row's drafted slots (`drafted_slots`), 0 on everything the base computes."""
    gate = torch.zeros((len(rows), width))
    for row, slots in enumerate(rows):
        gate[row, list(slots)] = 1.0
    return gate.to(device) if device is not None else gate


@contextlib.contextmanager
def gated(model: nn.Module, gate: torch.Tensor | None) -> Iterator[None]:
    """The model's adapter acts where `gate` [B, L] is 1 for the duration; a model without one ignores the gate."""
    adapter = draft_adapter(model)
    if adapter is None or gate is None:
        yield
        return
    previous = adapter.gate
    adapter.set_gate(gate)
    adapter.hook()
    try:
        yield
    finally:
        adapter.set_gate(previous)
        if previous is None:
            adapter.unhook()


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's own weights without its adapter: what a model directory's weight files hold."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(f"{ATTRIBUTE}.")}


def adapter_file(adapter: DraftAdapter) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) to write as `FILE` (fp32, contiguous, on the CPU)."""
    tensors = {f"{part}.{k}": v.detach().float().cpu().contiguous() for part in ("a", "b") for k, v in getattr(
        adapter, part).items()}  # fmt: skip
    return tensors, adapter.metadata()


def directory_parts(model: nn.Module) -> dict:
    """What a model directory of a model with an adapter holds, as `save_model_dir` arguments: the frozen base's
    weights as loaded (fp32: rounded to a bf16 compute dtype, they would verify with other weights than the base
    whose greedy text the adapter model promises) and the adapter's own file."""
    adapter = draft_adapter(model)
    if adapter is None:
        raise ValueError(f"{type(model).__name__} has no draft adapter")
    return {
        "state_dict": base_state_dict(model),
        "dtype": torch.float32,
        "extra_tensors": {FILE: adapter_file(adapter)},
    }


def load_draft_adapter(model: nn.Module, directory: Path) -> DraftAdapter | None:
    """Attach the adapter a model directory keeps (None when it keeps none), in the model's dtype and device."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(directory) / FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    tensors = load_file(str(path))
    try:
        config = DraftLora(
            rank=int(meta["rank"]),
            alpha=float(meta["alpha"]),
            targets=tuple(meta["targets"].split(",")) if meta.get("targets") else TARGETS,
            last_layers=int(meta["last_layers"]) if meta.get("last_layers") else None,
        )
    except (KeyError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        raise ValueError(
            f"{path}: no rank/alpha in its metadata, or invalid ones ({err}): not a draft adapter file"
        ) from None
    adapter = attach_draft_adapter(model, config)
    param = next(model.parameters())
    state = {k: v.to(param.dtype) for k, v in tensors.items()}
    missing, unexpected = adapter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit {type(model).__name__}: missing {sorted(missing)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]}"
        )
    return adapter
