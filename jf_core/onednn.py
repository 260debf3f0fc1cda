"""oneDNN's primitive cache, sized for training's shapes.

A bf16 product on a CPU is a oneDNN primitive made for its exact shape (a JIT-compiled kernel), kept in a
process-wide LRU cache of `ONEDNN_PRIMITIVE_CACHE_CAPACITY` primitives (oneDNN's default: 1,024). A draft adapter's
training step is one packed sequence of a new length almost every step (its context, its spans, the positions its
losses read), and each length makes a primitive for every product of the forward and backward: the default cache
fills within the first steps of a run and from then on evicts primitives the next steps need again. Measured on
this project's 2-core Intel Xeon (AMX), 150 steps of the SmolLM2 profile's recipe on 64 GSM8K questions, the step
climbed from 1.36 to 1.69 s with the default and stayed at 1.29-1.36 s with 16,384
(docs/training.md, "oneDNN's primitive cache").

The capacity is read once, when the process makes its first primitive, so it is set in the environment at each
entry point (the CLI, the flows, the training loop, the training benchmark) before any product runs, and every
process they start inherits it. A value already in the environment is the user's, and kept."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
CAPACITY = 16384


def size_primitive_cache(env: MutableMapping[str, str] = os.environ) -> None:
    """`CAPACITY` as oneDNN's primitive cache capacity in `env`, unless it already names one."""
    env.setdefault(CACHE_ENV, str(CAPACITY))
