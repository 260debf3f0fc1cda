"""The serving core: requests with different budgets and stop strings share a batch and each gets exactly what greedy
AR with its own budget writes; dispatch runs AR above the artifact's crossover and when running acceptance does not
pay; bad requests are refused by name; the jacobi_forcing block does not change what the model is."""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import replace

import pytest

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.decoding.sampling import Sampling
from jf_core.model_dir import Crossover, model_fingerprint, read_block, update_block
from jf_core.serving.engine import Engine, Request, RequestError
from tests.conftest import serving_prior

PROMPTS = ["program: a=85; step -8; return f", "program: a=3; step +2; return c", "program: b=7; return b"]


@pytest.fixture()
def engine(profile, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(profile.model.path, model_dir)
    from jf_core.model_dir import save_decode_config

    save_decode_config(model_dir, JFDecodeConfig(block_size=4, num_blocks=2, pool_size=2, max_new_tokens=16))
    return Engine.load(model_dir, dtype="float32")


def greedy(engine: Engine, prompt: list[int], budget: int) -> list[int]:
    out = ar_decode(engine.model, [prompt], max_new_tokens=budget, stop=engine.stop)
    return out.sequences[0]


@pytest.mark.parametrize("method", ["jacobi", "ar"])
def test_requests_with_different_budgets_and_stops_share_a_batch(engine, method):
    ids = [engine.encode(p) for p in PROMPTS]
    budgets = [3, 16, 9]
    full = engine.tokenizer.decode(greedy(engine, ids[1], 16), skip_special_tokens=True)
    stop = full[4:6]  # a string greedy AR writes: the completion must end right before it
    requests = [Request(ids[0], 3), Request(ids[1], 16, stop=(stop,)), Request(ids[2], 9)]
    streamed: dict[int, list[str]] = {}
    out = engine.complete(requests, method=method, on_text=lambda i, chunk: streamed.setdefault(i, []).append(chunk))
    assert [c.method for c in out] == [method] * 3
    assert ["".join(streamed.get(i, [])) for i in range(3)] == [c.text for c in out]  # streamed == returned
    for c, prompt, budget in zip(out, ids, budgets, strict=True):
        want = greedy(engine, prompt, budget)
        text = engine.tokenizer.decode(want, skip_special_tokens=True)
        if c is out[1]:
            assert c.text == text[: text.find(stop)] and c.finish_reason == "stop"
            assert engine.tokenizer.decode(c.tokens, skip_special_tokens=True).startswith(c.text)
        else:
            assert c.tokens == want and c.text == text
            assert c.finish_reason == ("stop" if want[-1] in engine.stop.eos else "length")
        assert c.prompt_tokens == len(prompt) and c.forwards >= 1


def test_dispatch_runs_ar_above_the_crossover(engine):
    engine.spec = replace(engine.spec, prior=serving_prior(ar_above_batch=2))
    ids = [Request(engine.encode(p), 8) for p in PROMPTS]
    assert {c.method for c in engine.complete(ids[:2])} == {"jacobi"}
    assert {c.method for c in engine.complete(ids)} == {"ar"}  # 3 > 2
    assert engine.dispatched == {"jacobi": 1, "ar": 1}


def test_dispatch_falls_back_to_ar_when_acceptance_does_not_pay(engine):
    engine.spec = replace(engine.spec, prior=serving_prior(None, break_even_tpf=1e9))  # no acceptance can pay
    engine.clock = itertools.count().__next__  # every batch takes "1 s": equal rates, so the prior decides
    request = [Request(engine.encode(PROMPTS[0]), 8)]
    methods = [engine.complete(request)[0].method for _ in range(10)]
    assert methods[0] == "jacobi" and methods[2] == "jacobi"  # two Jacobi batches before the running mean decides
    assert methods[1] == "ar" and methods[9] == "jacobi"  # a bucket's 2nd batch and every 8th after probe the other
    assert methods[3:9] == ["ar"] * 6
    engine.spec = replace(engine.spec, prior=serving_prior(None, break_even_tpf=0.5))  # any acceptance pays
    assert engine.complete(request)[0].method == "jacobi"


def test_measured_tokens_per_second_override_the_crossover_and_stay_lossless(engine):
    engine.spec = replace(engine.spec, prior=serving_prior(ar_above_batch=1))  # the prior: AR for 3 requests
    requests = [Request(engine.encode(p), 8) for p in PROMPTS]
    first = engine.complete(requests)
    assert {c.method for c in first} == {"ar"} and engine.dispatch.rates[("ar", 4)] > 0  # measured as it served
    engine.dispatch.rates[("jacobi", 4)] = engine.dispatch.rates[("ar", 4)] * 3  # this server saw Jacobi pay
    engine.dispatch.batches[4] = 2  # past the probe
    again = engine.complete(requests)
    assert {c.method for c in again} == {"jacobi"}
    assert [c.tokens for c in again] == [c.tokens for c in first]


@pytest.mark.parametrize("method", ["jacobi", "ar"])
def test_sampled_requests_get_the_ar_sample_of_their_own_seed(engine, method):
    sampling = Sampling(temperature=3.0, top_k=5)
    ids = [engine.encode(p) for p in PROMPTS]
    requests = [
        Request(prompt, budget, sampling=sampling, seed=seed)
        for prompt, budget, seed in zip(ids, (16, 5, 9), (7, 8, 9), strict=True)
    ]
    out = engine.complete(requests, method=method)
    for c, request in zip(out, requests, strict=True):
        want = ar_decode(
            engine.model,
            [request.prompt],
            max_new_tokens=request.max_new_tokens,
            sampling=sampling,
            seeds=[request.seed],
            stop=engine.stop,
        )
        assert c.tokens == want.sequences[0]
    greedy_out = [greedy(engine, prompt, 16) for prompt in ids[:1]]
    reseeded = engine.complete([Request(ids[0], 16, sampling=sampling, seed=s) for s in range(8)], method=method)
    assert any(c.tokens != greedy_out[0] for c in reseeded)  # it samples
    assert Request(ids[0], 4, sampling=sampling).seed is not None  # no seed: a random one, kept with the request
    with pytest.raises(ValueError, match="one sampling setting"):
        engine.complete([requests[0], Request(ids[1], 4)])


def test_bad_requests_are_named(engine):
    limit = 32
    with pytest.raises(RequestError, match="prompt: empty"):
        engine.check(Request([], 4), limit)
    with pytest.raises(RequestError, match=r"max_tokens: 0 is outside \[1, 32\]"):
        engine.check(Request([5], 0), limit)
    with pytest.raises(RequestError, match=r"max_tokens: 33"):
        engine.check(Request([5], 33), limit)
    with pytest.raises(RequestError, match="exceed the model's context of 64 tokens"):
        engine.check(Request([5] * 60, 8), limit)
    program = "program: a=85; step -8; return f"
    assert engine.chat_prompt([{"role": "user", "content": program}]) == engine.encode(program)
    with pytest.raises(RequestError, match="messages: the embedded model answers a program: the last message must"):
        engine.chat_prompt([{"role": "user", "content": program}, {"role": "assistant", "content": "a=85;"}])
    engine.tokenizer.chat_template = None  # a model without one
    with pytest.raises(RequestError, match="no chat template"):
        engine.chat_prompt([{"role": "user", "content": "hi"}])


def test_the_block_is_about_the_model_not_of_it(engine, tmp_path):
    model_dir = tmp_path / "model"
    before = model_fingerprint(model_dir)
    update_block(model_dir, **serving_prior(ar_above_batch=16, hardware="elsewhere").block())
    assert model_fingerprint(model_dir) == before
    assert read_block(model_dir)["decode"]["block_size"] == 4 and read_block(model_dir)["format"] == 1
    config = json.loads((model_dir / "config.json").read_text())
    config["hidden_size"] += 1
    (model_dir / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(model_dir) != before


def test_crossover_is_the_last_batch_size_where_jacobi_paid():
    assert Crossover([1, 2, 4, 8], [2.5, 1.8, 1.1, 0.7], [3.0, 3.0, 3.0, 3.0]).ar_above_batch == 4
    assert Crossover([1, 2], [2.5, 1.2], [3.0, 3.0]).ar_above_batch is None
    assert Crossover([1, 2], [0.9, 0.5], [1.2, 1.2]).ar_above_batch == 0
    assert Crossover([1], [2.0], [3.0]).break_even_tpf == pytest.approx(1.5)  # a forward costs 1.5 AR steps
