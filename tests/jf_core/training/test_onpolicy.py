"""On-policy states: the model decodes its training prompts and the states it visits join the pools of exactly the
blocks whose context and fixed point it reproduced."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from jf_core.decoding.common import StopTokens
from jf_core.training.noise import NoiseSchedule
from jf_core.training.onpolicy import OnPolicyStates
from jf_core.training.packing import pack_records
from jf_core.trajectory.collect import CollectConfig, collect
from jf_core.trajectory.prompts import PromptItem
from tests.conftest import PAD, TINY_MODELS

STOP = StopTokens(None, PAD)


def _examples(model, seed=0):
    g = torch.Generator().manual_seed(0)
    prompts = [PromptItem(f"p{i}", torch.randint(3, 500, (4 + i,), generator=g).tolist()) for i in range(3)]
    cfg = CollectConfig(block_size=4, max_new_tokens=12, batch_size=3, seed=seed)
    records = collect(model, SimpleNamespace(eos_token_id=None, pad_token_id=PAD), prompts, cfg, model_hash="h")
    return pack_records(records.records, NoiseSchedule("uniform_state"), max_length=256)[0]


def test_the_same_model_adds_its_new_states_to_every_block():
    model = TINY_MODELS["qwen2"]()
    examples = _examples(model)
    before = [[list(map(tuple, pool)) for pool in e.states] for e in examples]
    # Another draft seed: the same fixed points, reached through other states.
    hook = OnPolicyStates(examples, prompts=2, stop=STOP, seed=9)
    first = hook(model)
    assert first["onpolicy_blocks_matched"] == 1.0 and first["onpolicy_states_added"] > 0
    assert first["onpolicy_tpf"] >= 1.0
    second = hook(model)  # the next prompts in turn, wrapping around
    assert second["onpolicy_blocks_matched"] == 1.0
    for example, old in zip(examples, before, strict=True):
        for pool, old_pool, fixed in zip(example.states, old, example.clean, strict=True):
            assert pool[-1] == fixed  # the fixed point stays last
            assert set(old_pool) <= set(map(tuple, pool)) and len(set(map(tuple, pool))) == len(pool)
            assert all(state[0] == fixed[0] for state in pool)
    assert any(len(e.states[0]) > len(b[0]) for e, b in zip(examples, before, strict=True))
    # The same seed as collection: exactly the recorded states, nothing new.
    again = OnPolicyStates(_examples(model), prompts=3, stop=STOP, seed=0)(model)
    assert again["onpolicy_states_added"] == 0.0 and again["onpolicy_blocks_matched"] == 1.0


def test_a_model_with_other_text_adds_nothing_where_the_text_left():
    examples = _examples(TINY_MODELS["qwen2"]())
    sizes = [[len(pool) for pool in e.states] for e in examples]
    other = TINY_MODELS["llama"]()  # same vocabulary, other weights: other greedy text from block 0 on
    out = OnPolicyStates(examples, prompts=3, stop=STOP, seed=9)(other)
    assert out["onpolicy_blocks_matched"] == 0.0 and out["onpolicy_states_added"] == 0.0
    assert [[len(pool) for pool in e.states] for e in examples] == sizes
