"""bench/grouped_attention.py: a config named `*-copied` decodes on transformers' SDPA, its twin on the grouped
kernel, in one `measure_cycles` run, both AR's output."""

from __future__ import annotations

import jf_core.decoding.jacobi as jacobi
import jf_core.evaluation.cycle_cost as cycle_cost
from jf_core.decoding.backends import attention_implementation
from jf_core.decoding.common import StopTokens
from jf_core.decoding.grouped_attention import GROUPED_SDPA
from jf_core.decoding.jacobi import JacobiConfig
from tests.conftest import PAD, _qwen2
from tests.jf_core.decoding.test_jacobi import prompts


def test_copied_configs_decode_on_transformers_sdpa_and_their_twins_on_the_grouped_kernel(monkeypatch):
    from bench import grouped_attention as bench

    for module, name in ((jacobi, "grouped_attention"), (cycle_cost, "measure_cycles"), (cycle_cost, "_decode")):
        monkeypatch.setattr(module, name, getattr(module, name))  # undone after the test
    bench.install()
    model = _qwen2()
    seen: dict[str, set] = {}
    current = {"name": None}
    decode = cycle_cost._decode

    def named(on, prompt, config, **kwargs):
        current["name"] = "ar" if config is None else "copied" if id(config) in bench._copied_configs else "grouped"
        return decode(on, prompt, config, **kwargs)

    monkeypatch.setattr(cycle_cost, "_decode", named)
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.setdefault(current["name"], set()).add(attention_implementation(module.config))
    )
    config = JacobiConfig(block_size=6)
    costs = cycle_cost.measure_cycles(
        model, prompts(2), {"w-copied": config, "w": JacobiConfig(block_size=6)}, max_new_tokens=16,
        stop=StopTokens(None, PAD),
    )  # fmt: skip
    assert set(costs) == {"ar", "w-copied", "w"}
    assert seen == {"ar": {"sdpa"}, "copied": {"sdpa"}, "grouped": {GROUPED_SDPA}}
