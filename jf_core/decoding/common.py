"""Input checks, prompt batching and the output type shared by every decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from jf_core.decoding.stats import DecodeStats


@dataclass
class DecodeOutput:
    sequences: list[list[int]]  # new tokens per prompt, in input order; EOS included when it was reached
    stats: DecodeStats


def check_inputs(prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts:
        raise ValueError("no prompts given")
    out = []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: a decoder needs at least one prompt token")
        out.append([int(t) for t in p])
    return out


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


# Streaming: called with (sequence index, its newly final tokens) as soon as a forward makes them known; the chunks
# of one sequence concatenate to its output (EOS included when reached). Greedy verification never takes a
# committed token back, so what was streamed is never revised.
TokenSink = Callable[[int, list[int]], None]

EosIds = int | Iterable[int] | None  # what StopTokens takes: one id, several (Qwen instruct has two), or none


@dataclass(frozen=True)
class StopTokens:
    """The one value every decoder takes for where a sequence ends and what pads a batch: every EOS id (instruct
    models have several: Qwen's `<|im_end|>` and `<|endoftext|>`) and the pad id. `models.stop_tokens(model,
    tokenizer)` reads both from a model; `StopTokens(2, 0)` names them."""

    eos: frozenset[int]
    pad: int

    def __init__(self, eos: EosIds, pad: int) -> None:
        if isinstance(pad, bool) or not isinstance(pad, int):
            raise ValueError(f"pad token id must be an int, got {pad!r} (models.load_model gives a tokenizer one)")
        object.__setattr__(self, "eos", eos_set(eos))
        object.__setattr__(self, "pad", pad)


def eos_set(eos_token_id: EosIds) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(t) for t in eos_token_id)


def first_eos(tokens: Sequence[int], eos: frozenset[int], start: int = 0) -> int | None:
    """Index of the first token in `tokens[start:]` that is an EOS id, or None."""
    return next((i for i in range(start, len(tokens)) if tokens[i] in eos), None)


def finish(tokens: list[int], eos: frozenset[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at max_new_tokens; say whether the sequence is finished."""
    end = first_eos(tokens, eos)
    if end is not None:
        return tokens[: end + 1][:max_new_tokens], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def batches_of(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[list[int]]]:
    return [[list(p) for p in prompts[i : i + batch_size]] for i in range(0, len(prompts), batch_size)]


def concat_outputs(outs: Sequence[DecodeOutput]) -> DecodeOutput:
    """Outputs of consecutive batches as one: sequences in order, statistics merged."""
    stats = DecodeStats(sequences=[])
    for out in outs:
        stats = stats.merge(out.stats)
    return DecodeOutput([seq for out in outs for seq in out.sequences], stats)


def decode_batched(
    decoder: Callable[[list[list[int]]], DecodeOutput], prompts: Sequence[Sequence[int]], batch_size: int
) -> DecodeOutput:
    """`decoder` over `prompts` in batches of `batch_size`: outputs in order, statistics merged."""
    return concat_outputs([decoder(batch) for batch in batches_of(prompts, batch_size)])
