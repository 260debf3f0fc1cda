"""Exact-match accuracy of a model on the embedded task, through any of the project's decoders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jf_core.decoding import DecodeOutput
from jf_core.decoding.common import decode_batched
from jf_core.decoding.stats import DecodeStats
from jf_core.toy.task import ToyExample, score

Decoder = Callable[[list[list[int]]], DecodeOutput]


@dataclass
class ToyEvaluation:
    accuracy: float
    correct: int
    total: int
    stats: DecodeStats
    predictions: list[str]


def evaluate(tokenizer, examples: Sequence[ToyExample], decode: Decoder, batch_size: int = 32) -> ToyEvaluation:
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    out = decode_batched(decode, prompts, batch_size)
    predictions, stats = [tokenizer.decode(seq, skip_special_tokens=True) for seq in out.sequences], out.stats
    correct = sum(score(p, e) for p, e in zip(predictions, examples, strict=False))
    return ToyEvaluation(correct / len(examples), correct, len(examples), stats, predictions)
