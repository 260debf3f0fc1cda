"""Synthetic trajectories: upstream's masking-based preparation (`1_progressive_masking_based_prepare_trajectory.py`,
`corrupt_chunk`), on the model's own greedy output (`kind: synthetic`) or on the prompt file's reference answers
(`kind: text`, upstream's own source).

No Jacobi decoding: greedy AR generates each prompt's answer in batches (far cheaper per token than Jacobi's
n-wide windows at TPF ~1), or the answer is the row's reference text (`prompts.answer_field`) tokenized as the model
would write it after the prompt, its end of turn after it: no forward at all. The answer is cut into blocks of n,
and block j's states are its fixed point with the last r tokens replaced by noise, for r = n - 1 down to 0 (the
fixed point itself, last). The block's first token is never corrupted: in a Jacobi block it is the known-correct
token. Noise (`trajectory.corruption`):

- `context`: tokens drawn uniformly from the last `LOOKUP` tokens of prompt + answer up to the block's first token
  (upstream's `lookup_context_len=128`; the decoder's `prompt_sample` initial draft draws from the same text);
- `vocab`: uniform random vocabulary ids.

The records have the Jacobi records' schema and invariants (schema.py), `kind` "synthetic" or "text", so packing,
the noise schedules and training take either. Upstream pads answers with EOS; here, as in Jacobi records, a block
ending at EOS holds pad tokens after it and `length` counts through EOS.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

import torch

from jf_core.decoding import ar_decode
from jf_core.decoding.common import first_eos
from jf_core.models import stop_tokens

Corruption = Literal["context", "vocab"]
LOOKUP = 128


def corrupted_states(
    fixed_point: Sequence[int], context: Sequence[int], corruption: Corruption, vocab_size: int, rng: random.Random
) -> list[list[int]]:
    """Block states from the most corrupted (all but the first token) to the fixed point itself: n states."""
    n = len(fixed_point)
    pool = list(context[-LOOKUP:]) if corruption == "context" else None
    states = []
    for r in range(n - 1, -1, -1):
        noise = rng.choices(pool, k=r) if pool else [rng.randrange(vocab_size) for _ in range(r)]
        states.append(list(fixed_point[: n - r]) + noise)
    states[-1] = list(fixed_point)
    return states


def reference_answers(items, tokenizer, stop, max_new: int) -> list[list[int]]:
    """Each item's reference answer as tokens after its prompt: the text, then the end of turn (the tokenizer's
    EOS where it is a stop token), cut at `max_new` tokens as generation would be."""
    end = tokenizer.eos_token_id if tokenizer.eos_token_id in stop.eos else min(stop.eos)
    answers = []
    for item in items:
        if item.answer is None:
            raise ValueError(
                f"prompt {item.prompt_id!r} has no reference answer: trajectory.kind text needs prompts.answer_field"
            )
        answers.append((tokenizer(item.answer, add_special_tokens=False)["input_ids"] + [end])[:max_new])
    return answers


def synthesize(model: torch.nn.Module, tokenizer, prompts, cfg, *, model_hash: str) -> tuple[list[dict], int]:
    """(records, answer tokens made) for `prompts` (PromptItem) under a CollectConfig whose `kind` is synthetic
    (greedy AR's answers) or text (the reference answers): one record per prompt x block, as `collect` writes
    Jacobi ones."""
    stop = stop_tokens(model, tokenizer)
    eos_ids = stop.eos
    n, pad = cfg.block_size, stop.pad
    max_new = math.ceil(cfg.max_new_tokens / n) * n  # whole blocks, as Jacobi collection generates
    records: list[dict] = []
    new_tokens = 0
    for first in range(0, len(prompts), cfg.batch_size):
        batch = prompts[first : first + cfg.batch_size]
        if cfg.kind == "text":
            answers = reference_answers(batch, tokenizer, stop, max_new)
        else:
            with torch.no_grad():
                answers = ar_decode(model, [p.token_ids for p in batch], max_new_tokens=max_new, stop=stop).sequences
        new_tokens += sum(len(a) for a in answers)
        for item, answer in zip(batch, answers, strict=True):
            rng = random.Random(f"{cfg.seed}:synthetic:{item.prompt_id}")
            for j in range(math.ceil(len(answer) / n)):
                chunk = list(answer[j * n : (j + 1) * n])
                end = first_eos(chunk, eos_ids)
                length = end + 1 if end is not None else len(chunk)
                fixed = chunk[:length] + [pad] * (n - length)
                context = list(item.token_ids) + list(answer[: j * n + 1])
                states = corrupted_states(fixed, context, cfg.corruption, model.config.vocab_size, rng)
                records.append(
                    {
                        "prompt_id": item.prompt_id,
                        "round_id": cfg.round_id,
                        "block_index": j,
                        "n": n,
                        "prompt_ids": item.token_ids,
                        "states": states,
                        "fixed_point": fixed,
                        "length": length,
                        "iterations": len(states) - 1,
                        "model_hash": model_hash,
                        "seed": cfg.seed,
                        "kind": cfg.kind,
                    }
                )
    return records, new_tokens
