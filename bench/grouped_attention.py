"""What reading grouped KV heads in place (jf_core/decoding/grouped_attention.py) saves a decoding cycle: `jf bench
cycle` with its arguments as given, where every `--config` whose name ends in `-copied` decodes on transformers' own
SDPA (each KV head copied once per query head, `repeat_kv`) and the others on the grouped kernel, so each config is
timed both ways in one run, the methods taking turns prompt by prompt, every output checked against AR's.

    .venv/bin/python bench/grouped_attention.py bench cycle --profile smollm2-135m \
        --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --model BASE_DIR --no-tuned --num-prompts 8 \
        --max-new-tokens 128 --threads 2 --config 'untrained-copied:{"lookup": 16}' --config 'untrained:{"lookup": 16}'

Run it alone: a neighbour's time slices land in whichever method is running.
"""

from __future__ import annotations

import contextlib
import sys

import jf_core.decoding.jacobi as jacobi
import jf_core.evaluation.cycle_cost as cycle_cost
from jf_cli.main import main
from jf_core.decoding.backends import grouped_attention

COPIED = "-copied"
_copied_configs: set[int] = set()  # ids of the configs that decode on transformers' SDPA
_copying = False


def _switch(model):
    return contextlib.nullcontext() if _copying else grouped_attention(model)


def _measure(model, prompts, configs, **kwargs):
    for name, config in configs.items():
        if name.endswith(COPIED):
            _copied_configs.add(id(config[1] if isinstance(config, tuple) else config))
    return measure_cycles(model, prompts, configs, **kwargs)


def _decode(model, prompt, config, **kwargs):
    global _copying
    _copying = id(config) in _copied_configs
    try:
        return decode(model, prompt, config, **kwargs)
    finally:
        _copying = False


def install() -> None:
    """The bench's one intervention: the decoder's switch, per config (the decoder has no option for it: nothing but
    a measurement wants the slower form)."""
    global measure_cycles, decode
    measure_cycles, decode = cycle_cost.measure_cycles, cycle_cost._decode
    jacobi.grouped_attention = _switch
    cycle_cost.measure_cycles, cycle_cost._decode = _measure, _decode


if __name__ == "__main__":
    install()
    sys.exit(main(sys.argv[1:]))
