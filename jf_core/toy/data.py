"""Tokenised, padded batches of the embedded task for AR training (labels only on the answer and its EOS)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch

from jf_core.toy.task import ToyExample


def encode_examples(tokenizer, examples: Sequence[ToyExample]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) per example, in one batched call each (the same ids as one call per text, in
    a tenth of the time: the bootstrap encodes 60,000 examples)."""
    if not examples:
        return []
    prompts = tokenizer([e.prompt for e in examples], add_special_tokens=False)["input_ids"]
    answers = tokenizer([e.answer for e in examples], add_special_tokens=False)["input_ids"]
    return [(p, [*a, tokenizer.eos_token_id]) for p, a in zip(prompts, answers, strict=True)]


def ar_batches(
    tokenizer, examples: Sequence[ToyExample], batch_size: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless shuffled epochs of right-padded batches of similar lengths: a shuffled pool of 32 batches is sorted
    by length and cut into batches, which are then shuffled, so padding (compute spent on nothing) stays small."""
    if len(examples) < batch_size:
        raise ValueError(f"ar_batches: {len(examples)} examples cannot fill one batch of batch_size={batch_size}")
    encoded = encode_examples(tokenizer, examples)
    rng = random.Random(seed)
    order = list(range(len(encoded)))
    # A pool of whole batches, no larger than the examples (a pool larger than them yielded nothing, forever).
    pool = min(32 * batch_size, len(order) // batch_size * batch_size)
    while True:
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order) - pool + 1, pool):
            chunk = sorted(order[start : start + pool], key=lambda i: len(encoded[i][0]) + len(encoded[i][1]))
            batches += [chunk[b : b + batch_size] for b in range(0, pool, batch_size)]
        rng.shuffle(batches)
        for batch in batches:
            rows = [encoded[i] for i in batch]
            width = max(len(p) + len(a) for p, a in rows)
            ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
            labels = torch.full((batch_size, width), -100, dtype=torch.long)
            mask = torch.zeros((batch_size, width), dtype=torch.long)
            for r, (p, a) in enumerate(rows):
                seq = p + a
                ids[r, : len(seq)] = torch.tensor(seq)
                labels[r, len(p) : len(seq)] = torch.tensor(a)
                mask[r, : len(seq)] = 1
            yield {"input_ids": ids, "attention_mask": mask, "labels": labels}
