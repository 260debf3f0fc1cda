"""oneDNN's primitive cache, sized for training's shapes.

A bf16 product on a CPU is a oneDNN primitive made for its exact shape (a JIT-compiled kernel), kept in a
process-wide LRU cache of `ONEDNN_PRIMITIVE_CACHE_CAPACITY` primitives (oneDNN's default: 1,024). A draft adapter's
training step is one packed sequence of a new length almost every step (its context, its spans, the positions its
losses read), and each length makes a primitive for every product of the forward and backward: the default cache
fills within the first steps of a run and from then on evicts primitives the next steps need again. Measured on
this project's 2-core Intel Xeon (AMX), 150 steps of the SmolLM2 profile's recipe on 64 GSM8K questions, each in a
process of its own: under the default the step climbed from 1.41 to 1.67 s, under 16,384 it stayed at 1.28-1.32 s
(1.20x the tokens a second), for 1.4 GB more peak memory (docs/training.md, "oneDNN's primitive cache").

The capacity is read once, when the process makes its first primitive, so it is set in the environment before
that: at the CLI's entry (every process `jf` starts inherits it) and where a training process's first bf16 products
run (the auto dtype's measurement, the training loop's start, the training benchmark). A value already in the
environment is the user's, and kept."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
CAPACITY = 16384


def size_primitive_cache(env: MutableMapping[str, str] = os.environ) -> None:
    """`CAPACITY` as oneDNN's primitive cache capacity in `env`, unless it already names one."""
    env.setdefault(CACHE_ENV, str(CAPACITY))
