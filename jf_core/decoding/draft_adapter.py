"""A draft-only LoRA: weights that draft apart from the weights that verify.

Training the whole model on its own Jacobi trajectories makes it draft better, but the model that drafts is also the
model that verifies, so the text it accepts is its new greedy text: on questions it was not trained on, that text
changed (docs/real-models.md). With a draft adapter the base weights stay frozen and verify; low-rank adapters on the
attention and MLP projections act only on the positions that draft, chosen per token by a gate:

- the base computes every token that is committed (gate 0 on the verified window and so on the whole KV cache), and
  a draft token is accepted only where it equals the base's own greedy pick: the output is the base model's greedy
  output by construction, whatever the adapter learned (`JacobiDecoder` with an adapter, jf_core/decoding/jacobi.py);
- the adapter drafts from a second chain in the same forward: the window's draft tokens again, gated on, seeing the
  base's cache and their own chain. A forward carries 2n - 2 tokens instead of n (the chain skips the window's
  last slot, whose guess is never read), or n + `draft_span` with a shorter chain (JacobiConfig.draft_span).

The design is SGLang's UNO's (a draft-only LoRA, lossless against the base by construction). Training
(`training.draft_lora_rank`) gates the noisy blocks' drafted positions on and everything the decoder's cache would
hold off, so the adapter learns to map the base's context and its own draft to the base's fixed point.

The adapter is a submodule of the model (`jf_draft_adapter`: the optimizer, checkpoints and `.to()` reach it) whose
hooks add `gate * scale * B(A(x))` to each target projection's output while a gate is set (`gated`); outside it
the model is the base, exactly, with no hook on it. A model directory keeps it beside the base weights in
`draft_adapter.safetensors` (rank, scale and targets in the file's metadata), which `load_model` attaches.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

ATTRIBUTE = "jf_draft_adapter"
FILE = "draft_adapter.safetensors"
# Llama-family names (Qwen2, Llama, Mistral, SmolLM2, the embedded model): attention and MLP projections.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def target_projections(model: nn.Module, targets=TARGETS) -> list[tuple[str, nn.Linear]]:
    """The linear layers an adapter adds to: those named one of `targets` (also what `jf plan` counts)."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]


class DraftAdapter(nn.Module):
    def __init__(self, model: nn.Module, rank: int, alpha: float | None = None, targets=TARGETS) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"draft adapter rank must be >= 1, got {rank}")
        self.rank = rank
        self.alpha = float(alpha if alpha is not None else rank)
        self.scale = self.alpha / rank
        self.targets = tuple(targets)
        self.a = nn.ParameterDict()
        self.b = nn.ParameterDict()
        self.gate: torch.Tensor | None = None  # [B, L]: 1 where the adapter acts, None: the base everywhere
        # The projections it adds to, as a plain list (not submodules: they belong to the model). Their hooks are
        # registered only while a gate is set (`gated`): a module with hooks takes nn.Module's slow call path, which
        # cost AR several percent of a SmolLM2 step on this CPU with 210 hooked projections.
        self._targets: list[tuple[str, nn.Linear]] = []
        self._handles: list = []
        found = target_projections(model, self.targets)
        if not found:
            raise ValueError(
                f"{type(model).__name__} has no projection named {', '.join(self.targets)}: the draft adapter "
                "knows Llama-family layer names only"
            )
        for name, mod in found:
            key = name.replace(".", "__")
            a = torch.empty(rank, mod.in_features, dtype=mod.weight.dtype, device=mod.weight.device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # LoRA's init: A random, B zero, so the adapter starts at 0
            self.a[key] = nn.Parameter(a)
            self.b[key] = nn.Parameter(torch.zeros(mod.out_features, rank, dtype=a.dtype, device=a.device))
            self._targets.append((key, mod))

    def _add(self, key: str, _module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if self.gate is None:
            return None
        x = args[0]
        a, b = self.a[key], self.b[key]
        delta = (x @ a.to(x.dtype).T) @ b.to(x.dtype).T
        return output + delta * (self.scale * self.gate[..., None].to(delta.dtype))

    def hook(self) -> None:
        if not self._handles:
            self._handles = [m.register_forward_hook(functools.partial(self._add, k)) for k, m in self._targets]

    def unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def metadata(self) -> dict[str, str]:
        return {"rank": str(self.rank), "alpha": repr(self.alpha), "targets": ",".join(self.targets)}


def draft_adapter(model: nn.Module) -> DraftAdapter | None:
    """The model's draft adapter, or None (a plain model: it drafts with the weights that verify)."""
    return getattr(getattr(model, "module", model), ATTRIBUTE, None)


def attach_draft_adapter(model: nn.Module, rank: int, alpha: float | None = None) -> DraftAdapter:
    """Freeze `model` and give it a zero-initialised draft adapter (the only trainable weights from here on)."""
    if draft_adapter(model) is not None:
        raise ValueError(f"{type(model).__name__} already has a draft adapter")
    model.requires_grad_(False)
    adapter = DraftAdapter(model, rank, alpha)
    model.add_module(ATTRIBUTE, adapter)
    return adapter


@contextlib.contextmanager
def gated(model: nn.Module, gate: torch.Tensor | None) -> Iterator[None]:
    """The model's adapter acts where `gate` [B, L] is 1 for the duration; a model without one ignores the gate."""
    adapter = draft_adapter(model)
    if adapter is None or gate is None:
        yield
        return
    previous, adapter.gate = adapter.gate, gate
    adapter.hook()
    try:
        yield
    finally:
        adapter.gate = previous
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
        rank, alpha = int(meta["rank"]), float(meta["alpha"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"{path}: no rank/alpha in its metadata ({err}): not a draft adapter file") from None
    adapter = attach_draft_adapter(model, rank, alpha)
    param = next(model.parameters())
    state = {k: v.to(param.dtype) for k, v in tensors.items()}
    missing, unexpected = adapter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit {type(model).__name__}: missing {sorted(missing)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]}"
        )
    return adapter
