"""The LM head as decoding computes it: a window's logits by slices of the vocabulary on a CPU (or packed), and an
fp32 copy of a low-precision model's head; under training's CPU autocast its frozen weight cast once (packed.py)."""

from __future__ import annotations

import contextlib

import torch

from jf_core.layers.packed import CastWeight, PackedWeight, cast_cached, packable, switched_off

# A window's logits on a CPU: for a few rows against a large vocabulary MKL's sgemm is slow (SmolLM2's 49,152 x 576
# head: 33 ms for 11 rows against 10 ms for one, 2026-11-29, 2 threads) where the same rows against 2,048-row slices
# of the head, one after another, take 13-14 ms. Each logit is the same dot product either way (bit for bit: tests/
# jf_core/layers/test_heads.py). From 2 to 64 rows the slices were faster at every count measured; past that MKL's own
# blocking is as good. Where nothing needs a gradient, packed oneDNN weights (packed.py) beat both.
VOCAB_SLICE = 2048
SLICED_ROWS = 64
_switch = {"cast": True}


def uncast_head() -> contextlib.AbstractContextManager:
    """The head's frozen weight cast by autocast on every call meanwhile (as before `SlicedLMHead` kept a copy): what
    the kept copy saves is measured against it (bench/train_throughput.py)."""
    return switched_off(_switch, "cast")


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(hidden, weight, bias)`, by slices of the vocabulary where that is faster (above)."""
    rows = hidden.numel() // hidden.shape[-1]
    if hidden.device.type != "cpu" or not 1 < rows <= SLICED_ROWS or weight.shape[0] <= VOCAB_SLICE:
        return torch.nn.functional.linear(hidden, weight, bias)
    weights = weight.split(VOCAB_SLICE)
    biases = bias.split(VOCAB_SLICE) if bias is not None else [None] * len(weights)
    return torch.cat([torch.nn.functional.linear(hidden, w, b) for w, b in zip(weights, biases, strict=True)], -1)


class SlicedLMHead(torch.nn.Module):
    """The model's own LM head (its weight and bias: tied to the embedding where they were): packed where nothing
    needs a gradient (packed.py, faster still at every row count), cast once where training's CPU autocast computes
    with a frozen head, else by `head_logits`.

    A draft adapter's training reads the head 4-5 times a packed sequence (its loss chunks, teacher and student), and
    autocast casts a weight that needs no gradient on every call: SmolLM2-135M's tied 49,152 x 576 head cost 17 ms a
    cast, about 6% of a training step (2026-12-06, torch profiler over 8 steps). In bf16 the whole head in one
    product beats the slices at every row count measured (16 rows: 2.5 against 4.6 ms; 512: 37 against 42)."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.weight = head.weight
        self.bias = getattr(head, "bias", None)
        self.packed_weight: PackedWeight | None = None  # set where prepare_for_decoding packs the model's layers
        self.cast_weight = CastWeight()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None and packable(hidden, self.weight):
            return self.packed_weight.linear(hidden, self.weight, self.bias)
        if _switch["cast"] and cast_cached(hidden, self.weight):
            return self.cast_weight.linear(hidden, self.weight, self.bias)
        return head_logits(hidden, self.weight, self.bias)


def slice_lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """The model's LM head computing its logits by `head_logits` (`prepare_for_decoding` does it)."""
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        model.set_output_embeddings(SlicedLMHead(head))
    return model


class Fp32LMHead(torch.nn.Module):
    """An LM head computing logits in fp32 from a low-precision model's last hidden state."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)
        self.packed_weight: PackedWeight | None = None  # set where prepare_for_decoding packs the model's layers

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        if self.packed_weight is not None and packable(hidden, self.weight):
            return self.packed_weight.linear(hidden, self.weight, self.bias)
        return head_logits(hidden, self.weight, self.bias)


def upcast_lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """Replace the LM head with an fp32 copy (for decoding a bf16/fp16 model, never for training).

    bf16 logits keep 8 bits of mantissa: near the top of a 150k-token vocabulary two candidates often round to the
    same value, and which one wins then depends on which kernel ran. fp32 logits remove that source of argmax flips
    (the hidden state still differs between kernels). Measured on a random 4-layer Qwen2 (32 prompts, 64 tokens):
    Jacobi matched bf16 AR on 14/32 prompts with a bf16 head, 18/32 with this one, median first divergence 23 -> 39;
    fp32 throughout matched 32/32. Costs an fp32 copy of the head (vocab x hidden x 4 bytes) and its matmul."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no LM head to upcast")
    model.set_output_embeddings(Fp32LMHead(head))
    return model
