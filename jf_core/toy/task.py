"""The embedded default task: trace a tiny straight-line program.

A prompt is a loop unrolled over named variables: a start value, a step applied to each next variable, and the
variable to return; the answer is the chain-of-thought trace, one assignment per variable with its intermediate
result, then the returned value::

    prompt:  "program: a=84; step -7; return e"
    answer:  "a=84; b=a-7=77; c=b-7=70; d=c-7=63; e=d-7=56; answer 56"

Every answer token follows from a fixed slot of the prompt or from a few tokens before it (the previous result,
the step), which a 1M-parameter Qwen2 learns on 2 CPU cores in minutes; yet each value depends on all before it,
which Jacobi decoding cannot guess from a noisy draft for free while the surrounding text it can. With the embedded
Qwen2 tokenizer (digits are single tokens, as in Qwen2's own) answers are 40 to 150 tokens long. Accuracy is exact
match of the whole trace.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from dataclasses import dataclass

MAX_START = 99
VARIABLES = tuple("abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class ToyExample:
    """One item of the embedded task; `answer` is the full target continuation, `final` the returned value."""

    uid: str
    prompt: str
    answer: str
    final: int


@dataclass(frozen=True)
class ToyTaskConfig:
    min_steps: int = 6
    max_steps: int = 14
    seed: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.min_steps <= self.max_steps <= len(VARIABLES):
            raise ValueError(
                f"ToyTaskConfig: need 2 <= min_steps <= max_steps <= {len(VARIABLES)}, "
                f"got min_steps={self.min_steps}, max_steps={self.max_steps}"
            )


def _make_example(rng: random.Random, uid: str, cfg: ToyTaskConfig) -> ToyExample:
    steps = rng.randint(cfg.min_steps, cfg.max_steps)
    op = rng.choice("+-")
    if op == "+":
        step = rng.randint(1, 9)
        value = rng.randint(0, MAX_START)
    else:
        # Values never go below zero, so the trace is plain non-negative arithmetic.
        step = rng.randint(1, min(9, MAX_START // (steps - 1)))
        value = rng.randint(step * (steps - 1), MAX_START)
    return _example(uid, value, op, step, steps)


def _example(uid: str, start: int, op: str, step: int, steps: int) -> ToyExample:
    names = VARIABLES[:steps]
    value, trace = start, [f"a={start}"]
    for prev, name in itertools.pairwise(names):
        value = value + step if op == "+" else value - step
        trace.append(f"{name}={prev}{op}{step}={value}")
    prompt = f"program: a={start}; step {op}{step}; return {names[-1]}"
    answer = "; ".join(trace) + f"; answer {value}"
    return ToyExample(uid=uid, prompt=prompt, answer=answer, final=value)


PROMPT = re.compile(r"program: a=(\d+); step ([+-])(\d); return ([a-z])")


def example_of(prompt: str, cfg: ToyTaskConfig = ToyTaskConfig()) -> ToyExample | None:
    """The task's item for a prompt written by hand, its answer worked out; None when the task never makes such a
    prompt (a start above 99, a step of 0, fewer or more variables than `cfg` allows, a value below zero), so
    the model was never taught it: examples shown to people must be ones the model solves."""
    match = PROMPT.fullmatch(prompt)
    if match is None:
        return None
    start, op, step, last = int(match[1]), match[2], int(match[3]), match[4]
    steps = VARIABLES.index(last) + 1
    in_range = start <= MAX_START and step >= 1 and cfg.min_steps <= steps <= cfg.max_steps
    if not in_range or (op == "-" and (start < step * (steps - 1) or step > MAX_START // (steps - 1))):
        return None
    return _example("hand-written", start, op, step, steps)


# Splits partition the space of programs by a hash of the prompt, so a test program never occurs in training.
_SPLIT_BUCKETS = {"test": range(0, 1), "calib": range(1, 2), "train": range(2, 10)}


def _bucket(prompt: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 10


def make_split(split: str, size: int, cfg: ToyTaskConfig = ToyTaskConfig()) -> list[ToyExample]:
    """Deterministic examples of `split` (train, test or calib), disjoint from the other splits' programs."""
    if split not in _SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(_SPLIT_BUCKETS)}")
    rng = random.Random(f"{cfg.seed}:{split}")
    out: list[ToyExample] = []
    while len(out) < size:
        example = _make_example(rng, f"{split}-{len(out)}", cfg)
        if _bucket(example.prompt) in _SPLIT_BUCKETS[split]:
            out.append(example)
    return out


def score(prediction: str, example: ToyExample) -> bool:
    """Exact match of the generated continuation (EOS and surrounding whitespace stripped) against the trace."""
    return prediction.strip() == example.answer
