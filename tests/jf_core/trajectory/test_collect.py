"""Collected records are the decoder's trajectories: initial draft first, fixed point last, and the fixed points
are greedy AR's output block by block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.trajectory.collect import CollectConfig, collect
from jf_core.trajectory.prompts import PromptItem
from tests.conftest import PAD

TOK = SimpleNamespace(eos_token_id=None, pad_token_id=PAD)


def items(count=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [PromptItem(f"p{i}", torch.randint(3, 500, (3 + 2 * i,), generator=g).tolist()) for i in range(count)]


@pytest.mark.parametrize("block_size", [4, 16])
def test_records_are_complete_trajectories(tiny_model, block_size):
    prompts = items()
    cfg = CollectConfig(block_size=block_size, max_new_tokens=40, batch_size=3)
    result = collect(tiny_model, TOK, prompts, cfg, model_hash="h")
    whole = cfg.jacobi().max_new_tokens
    greedy = ar_decode(
        tiny_model, [p.token_ids for p in prompts], max_new_tokens=whole, stop=StopTokens(None, PAD)
    ).sequences
    for p, expected in zip(prompts, greedy, strict=True):
        rows = [r for r in result.records if r["prompt_id"] == p.prompt_id]
        assert [r["block_index"] for r in rows] == list(range(whole // block_size))
        assert [t for r in rows for t in r["fixed_point"][: r["length"]]] == expected
        for r in rows:
            assert r["states"][-1] == r["fixed_point"] and r["iterations"] == len(r["states"]) - 1
            assert r["states"][0][0] == r["fixed_point"][0]
            assert r["prompt_ids"] == p.token_ids and r["n"] == block_size


def test_deterministic_and_batch_invariant(tiny_model):
    prompts = items(4, seed=1)
    one = collect(
        tiny_model, TOK, prompts, CollectConfig(block_size=8, max_new_tokens=24, batch_size=1, seed=5), model_hash="h"
    )
    four = collect(
        tiny_model, TOK, prompts, CollectConfig(block_size=8, max_new_tokens=24, batch_size=4, seed=5), model_hash="h"
    )
    assert one.records == four.records
    other_seed = collect(
        tiny_model, TOK, prompts, CollectConfig(block_size=8, max_new_tokens=24, batch_size=4, seed=6), model_hash="h"
    )
    assert [r["fixed_point"] for r in other_seed.records] == [r["fixed_point"] for r in one.records]
    assert [r["states"][0] for r in other_seed.records] != [r["states"][0] for r in one.records]


@pytest.mark.parametrize("corruption", ["context", "vocab"])
def test_synthetic_records_are_greedy_blocks_with_corrupted_tails(tiny_model, corruption, tmp_path):
    """kind synthetic: no Jacobi decoding. The fixed points are greedy AR's output block by block, exactly as Jacobi
    records have them; block states keep the first k + 1 tokens and corrupt the rest, the fixed point last; the
    records pass the Jacobi records' rules and round-trip through a shard."""
    from jf_core.trajectory.schema import validate_record
    from jf_core.trajectory.store import read_shard, write_shard

    prompts = items(3)
    cfg = CollectConfig(block_size=4, max_new_tokens=10, batch_size=2, kind="synthetic", corruption=corruption)
    result = collect(tiny_model, TOK, prompts, cfg, model_hash="h")
    greedy = ar_decode(
        tiny_model, [p.token_ids for p in prompts], max_new_tokens=12, stop=StopTokens(None, PAD)
    ).sequences
    assert result.new_tokens == sum(len(g) for g in greedy)
    for p, expected in zip(prompts, greedy, strict=True):
        rows = [r for r in result.records if r["prompt_id"] == p.prompt_id]
        assert [r["block_index"] for r in rows] == [0, 1, 2]
        assert [t for r in rows for t in r["fixed_point"][: r["length"]]] == expected
        for r in rows:
            validate_record(r, "synthetic")
            assert r["kind"] == "synthetic" and r["model_hash"] == "h" and len(r["states"]) == 4
            context = set(p.token_ids + expected[: 4 * r["block_index"] + 1])
            for kept, state in enumerate(r["states"][:-1], start=1):
                assert state[:kept] == r["fixed_point"][:kept]
                if corruption == "context":  # upstream's noise: tokens of the text before the tail
                    assert set(state[kept:]) <= context
    noise = [t for r in result.records for s in r["states"][:-1] for t in s[1:]]
    assert len(set(noise)) > 10  # noise, not a constant
    again = collect(tiny_model, TOK, prompts, cfg, model_hash="h")
    assert again.records == result.records  # seeded by (seed, prompt): reproducible
    info = write_shard(
        tmp_path, "k", result.records, {}, prompts=3, new_tokens=result.new_tokens, seconds=result.seconds
    )
    assert read_shard(tmp_path / info.file).column("kind").to_pylist() == ["synthetic"] * len(result.records)


def test_text_records_are_the_reference_answers_blocks_with_no_forward(profile, tmp_path):
    """kind text: the fixed points are the prompt file's reference answers, tokenized as the model would write them
    after the prompt with the end of turn after them, cut at the trajectories' length; the states corrupted as
    synthetic ones are; the model never runs a forward. A prompt without an answer is refused by name."""
    from jf_core.models import load_model
    from jf_core.trajectory.schema import validate_record

    model, tok = load_model(profile.model.path)

    def no_forward(*_):
        raise AssertionError("kind text ran the model")

    model.register_forward_pre_hook(no_forward)
    answers = ["a=1+2=3", "b=4*5=20 so the answer is 20"]
    ids = [tok(f"q{i}?", add_special_tokens=False)["input_ids"] for i in range(len(answers))]
    prompts = [PromptItem(f"q{i}", ids[i], a) for i, a in enumerate(answers)]
    cfg = CollectConfig(block_size=4, max_new_tokens=10, batch_size=2, kind="text")
    result = collect(model, tok, prompts, cfg, model_hash="h")
    for p, answer in zip(prompts, answers, strict=True):
        expected = (tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:12]
        rows = [r for r in result.records if r["prompt_id"] == p.prompt_id]
        assert [t for r in rows for t in r["fixed_point"][: r["length"]]] == expected
        for r in rows:
            validate_record(r, "text")
            assert r["kind"] == "text" and r["states"][-1] == r["fixed_point"]
    assert result.new_tokens == sum(min(12, len(tok(a, add_special_tokens=False)["input_ids"]) + 1) for a in answers)
    with pytest.raises(ValueError, match=r"'q9' has no reference answer.*answer_field"):
        collect(model, tok, [PromptItem("q9", prompts[0].token_ids)], cfg, model_hash="h")


def test_a_prompt_file_gives_its_answers_where_asked(profile, tmp_path):
    """`prompts.answer_field`: each item carries its row's answer, a row without one is skipped as no_answer; the
    text kind is refused without the field, and the field with number variants (their answers are unknown)."""
    import json

    from jf_core.config import Profile, TrajectoryConfig
    from jf_core.models import load_model
    from jf_core.trajectory.prompts import load_prompts

    rows = [{"question": f"What is {i} plus 2?", "answer": f"{i + 2}"} for i in range(4)] + [{"question": "x?"}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = profile.prompts.model_copy(update={"source": str(tmp_path / "q.jsonl"), "text_field": "question",
                                             "id_field": None, "answer_field": "answer"})  # fmt: skip
    _, tok = load_model(profile.model.path)
    loaded = load_prompts(cfg, tok)
    assert sorted(i.answer for i in loaded.items) == ["2", "3", "4", "5"] and loaded.skipped["no_answer"] == 1
    data = profile.model_dump() | {"trajectory": TrajectoryConfig(kind="text").model_dump()}
    with pytest.raises(ValueError, match=r"prompts\.answer_field"):
        Profile.model_validate(data)
    with pytest.raises(ValueError, match="number_variants"):
        cfg.model_validate(cfg.model_dump() | {"number_variants": 2})
