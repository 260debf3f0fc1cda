"""oneDNN's primitive cache capacity (jf_core/onednn.py): set where the user set none, and in effect in a process
that makes more distinct bf16 products than oneDNN's default cache holds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jf_core.onednn import CACHE_ENV, CAPACITY, size_primitive_cache

DEFAULT_CAPACITY = 1024  # oneDNN's own


def test_the_capacity_is_set_where_the_user_set_none():
    env: dict[str, str] = {}
    size_primitive_cache(env)
    assert env == {CACHE_ENV: str(CAPACITY)} and CAPACITY > DEFAULT_CAPACITY
    env = {CACHE_ENV: "64"}
    size_primitive_cache(env)
    assert env == {CACHE_ENV: "64"}


# A process that makes more distinct bf16 products than oneDNN's default cache holds, then the first again: under
# the default the first was evicted (made again: cache_miss), under jf's capacity it is still kept (cache_hit).
# `setup` runs first, before any product: the entry point under test. From 2 rows: a one-row product is made anew
# on every call whatever the capacity (measured).
_PROBE = """
import torch
{setup}
w = torch.randn(64, 64)
with torch.autocast("cpu", dtype=torch.bfloat16):
    for rows in [*range(2, {shapes} + 2), 2]:
        torch.nn.functional.linear(torch.randn(rows, 64), w)
"""


def _last_creation(setup: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if k != CACHE_ENV} | {"ONEDNN_VERBOSE": "profile_create"}
    code = _PROBE.format(setup=setup, shapes=DEFAULT_CAPACITY + 50)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    made = [line for line in out.stdout.splitlines() if ",primitive,create:" in line and ",matmul," in line]
    return made[-1].split(",primitive,create:")[1].split(",")[0] if made else None


def test_the_cli_entry_and_the_training_loop_keep_more_products_than_onednn_default():
    """Without the capacity the first product is made again; after `jf`'s entry point, or a training loop's start
    in a process that set nothing (the training benchmark, a notebook), it is kept. A CPU whose bf16 products do
    not go through oneDNN makes none of them, and has nothing to size."""
    if _last_creation("") is None:
        pytest.skip("this CPU's bf16 linear layers make no oneDNN primitive")
    assert _last_creation("") == "cache_miss"  # the probe can fail: oneDNN's default evicts it
    entry = "from jf_cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert _last_creation(entry) == "cache_hit"
    # The loop's start, with no batch to train on: it stops at its first step (a training benchmark, a notebook).
    loop = "from jf_core.training.trainer import TrainConfig, train\ntry:\n"
    loop += "    train(torch.nn.Linear(2, 2), iter(()), None, TrainConfig(1, 1e-3, 0), progress=False)\n"
    loop += "except Exception:\n    pass"
    assert _last_creation(loop) == "cache_hit"
