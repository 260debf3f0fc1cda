"""transformers' own progress bars, kept for work that takes long enough to watch."""

from __future__ import annotations

SLOW_SECONDS = 5.0


def _delayed(factory, args, kwargs):
    return factory(*args, **{"delay": SLOW_SECONDS, **kwargs})


def bars_only_when_slow() -> None:
    """transformers draws a bar for every model it loads (`Loading weights`) and saves (`Writing model shards`). A
    round loads models and writes checkpoints dozens of times, and a small model's take no time: each left two bar
    lines in the round's log and nothing to watch. With tqdm's `delay`, a bar shows once its work has taken
    `SLOW_SECONDS` (a 7B model's load still shows one); hub downloads keep their own bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_tqdm_hook(_delayed)
