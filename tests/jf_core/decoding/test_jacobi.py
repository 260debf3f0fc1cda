"""Greedy Jacobi decoding is lossless: token for token what `model.generate(do_sample=False)` produces."""

from __future__ import annotations

import weakref

import pytest
import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from tests.conftest import PAD, VOCAB

PROMPT_LENGTHS = (5, 13, 2, 9)
MAX_NEW = 48


# Each model's references by what they depend on: the lossless matrices (test_multiblock.py's 168 cases and the
# others importing `reference`) ask for the same prompts' reference in every case, and generating them again was a
# third of those matrices' time.
_REFERENCES: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, list[int]]] = weakref.WeakKeyDictionary()


def _model_state(model: torch.nn.Module) -> tuple:
    """What `generate` reads besides the prompt: each weight tensor and its in-place version (a test that changes a
    weight gets a new reference), the modules (a packed layer swapped in computes differently), the attention
    backend."""
    return (
        tuple((p.data_ptr(), p._version) for p in model.parameters()),
        tuple(type(m) for m in model.modules()),
        getattr(model.config, "_attn_implementation", None),
    )


def reference(model, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """HF greedy generate on the prompt alone, cut after the first EOS (generate keeps no tokens after it);
    memoized per model state."""
    key = (_model_state(model), tuple(prompt), max_new_tokens, eos)
    known = _REFERENCES.setdefault(model, {})
    if key not in known:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=PAD,
        )[0, len(prompt) :].tolist()
        known[key] = out[: out.index(eos) + 1] if eos is not None and eos in out else out
    return list(known[key])


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)],), generator=g).tolist() for i in range(count)
    ]


@pytest.mark.parametrize("block_size", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("batch", [1, 4])
def test_jacobi_equals_generate(tiny_model, block_size, batch):
    ps = prompts(4)
    expected = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    cfg = JacobiConfig(block_size=block_size, max_new_tokens=MAX_NEW)
    got = []
    for start in range(0, len(ps), batch):
        got += jacobi_decode(tiny_model, ps[start : start + batch], cfg, stop=StopTokens(None, PAD)).sequences
    assert got == expected


@pytest.mark.parametrize("block_size", [2, 7, 16, 64])
def test_eos_mid_block(tiny_model, block_size):
    """EOS is set to a token greedy emits mid-block, at a different step for each prompt; decoding stops right
    after it, exactly where generate stops, while the other rows of the batch go on."""
    ps = prompts(4, seed=3)
    free = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    eos = free[0][block_size // 2 + 3]
    expected = [reference(tiny_model, p, MAX_NEW, eos) for p in ps]
    assert any(len(e) < MAX_NEW for e in expected) and any(e != f for e, f in zip(expected, free, strict=False))
    out = jacobi_decode(
        tiny_model, ps, JacobiConfig(block_size=block_size, max_new_tokens=MAX_NEW), stop=StopTokens(eos, PAD)
    )
    assert out.sequences == expected
    for seq, stats in zip(out.sequences, out.stats.sequences, strict=False):
        assert stats.new_tokens == len(seq)


@pytest.mark.parametrize("draft_init", ["prompt_sample", "repeat_last", "random_vocab"])
def test_every_draft_init_is_lossless(tiny_model, draft_init):
    ps = prompts(3, seed=5)
    expected = [reference(tiny_model, p, 30, None) for p in ps]
    cfg = JacobiConfig(block_size=8, max_new_tokens=30, draft_init=draft_init, seed=11)
    assert jacobi_decode(tiny_model, ps, cfg, stop=StopTokens(None, PAD)).sequences == expected


def test_max_new_tokens_is_exact(tiny_model):
    ps = prompts(2, seed=7)
    for max_new in (1, 2, 5, 17):
        out = jacobi_decode(
            tiny_model, ps, JacobiConfig(block_size=16, max_new_tokens=max_new), stop=StopTokens(None, PAD)
        )
        assert out.sequences == [reference(tiny_model, p, max_new, None) for p in ps]


def test_stats_count_every_forward(tiny_model):
    ps = prompts(3)
    ar = ar_decode(tiny_model, ps, max_new_tokens=MAX_NEW, stop=StopTokens(None, PAD))
    assert ar.stats.tpf == 1.0 and all(s.forwards == MAX_NEW for s in ar.stats.sequences)
    jac = jacobi_decode(tiny_model, ps, JacobiConfig(block_size=16, max_new_tokens=MAX_NEW), stop=StopTokens(None, PAD))
    for s in jac.stats.sequences:
        # prefill yields token 1; each decode forward commits len(accepted) tokens; the last known token is free.
        assert s.forwards == 1 + len(s.accepted)
        assert sum(s.accepted) + 1 >= s.new_tokens == MAX_NEW
        assert all(k >= 1 for k in s.accepted)
    assert jac.stats.tpf >= 1.0


def test_deterministic_and_independent_of_batch_mates(tiny_model):
    ps = prompts(4, seed=9)
    cfg = JacobiConfig(block_size=16, max_new_tokens=32, seed=3)
    alone = jacobi_decode(tiny_model, ps[:1], cfg, stop=StopTokens(None, PAD))
    together = jacobi_decode(tiny_model, ps, cfg, stop=StopTokens(None, PAD))
    assert alone.stats.sequences[0].accepted == together.stats.sequences[0].accepted


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(block_size=0), "block_size"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        JacobiConfig(**bad)


def test_empty_prompt_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        jacobi_decode(tiny_model, [[5, 6], []], JacobiConfig(), stop=StopTokens(None, PAD))


def test_ar_equals_generate_batched(tiny_model):
    ps = prompts(4, seed=2)
    expected = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    assert ar_decode(tiny_model, ps, max_new_tokens=MAX_NEW, stop=StopTokens(None, PAD)).sequences == expected
