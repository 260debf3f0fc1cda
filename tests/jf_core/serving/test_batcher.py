"""Batching: requests that arrive together decode as one batch (up to the maximum), each gets its own stream and
answer; a failing batch tells each of its requests and the batcher goes on."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from jf_core.decoding.sampling import Sampling
from jf_core.serving.batcher import Batcher
from jf_core.serving.engine import Engine, Request

PROMPTS = ["program: a=85; step -8; return f", "program: a=3; step +2; return c", "program: b=7; return b"]


@pytest.fixture()
def engine(profile, tmp_path):
    shutil.copytree(profile.model.path, tmp_path / "model")
    return Engine.load(tmp_path / "model", dtype="float32")


def test_requests_arriving_together_share_batches_up_to_the_maximum(engine):
    requests = [Request(engine.encode(PROMPTS[i % 3]), 4 + i) for i in range(5)]
    alone = [engine.complete([r])[0].text for r in requests]

    async def go():
        batcher = Batcher(engine, max_batch=4, max_wait_s=0.05)
        pending = [batcher.submit(r) for r in requests]
        streamed = []
        for p in pending:
            streamed.append("".join([chunk async for chunk in p.stream()]))
        await batcher.close()
        return batcher.batch_sizes, [p.completion.text for p in pending], streamed

    sizes, texts, streamed = asyncio.run(go())
    assert sizes == [4, 1] and texts == alone == streamed


def test_a_batch_shares_one_sampling_setting_and_the_others_wait_first_in_line(engine):
    hot, warm = Sampling(temperature=2.0), Sampling(temperature=1.0, top_p=0.9)
    kinds = [None, hot, None, warm, hot, None]
    requests = [Request(engine.encode(PROMPTS[i % 3]), 6, sampling=k, seed=i) for i, k in enumerate(kinds)]
    alone = [engine.complete([r])[0].text for r in requests]

    async def go():
        batcher = Batcher(engine, max_batch=8, max_wait_s=0.05)
        pending = [batcher.submit(r) for r in requests]
        texts = [(await p.result()).text for p in pending]
        await batcher.close()
        return batcher.batch_sizes, texts

    sizes, texts = asyncio.run(go())
    assert sizes == [3, 2, 1] and texts == alone  # greedy x3, then the first held kind (hot x2), then warm


def test_a_failing_batch_tells_each_request_and_the_batcher_goes_on(engine, monkeypatch):
    good = Request(engine.encode(PROMPTS[0]), 6)
    want = engine.complete([good])[0].text
    calls = []
    real = engine.complete

    def flaky(requests, **kwargs):
        calls.append(len(requests))
        if len(calls) == 1:
            raise RuntimeError("CUDA error: out of memory")
        return real(requests, **kwargs)

    monkeypatch.setattr(engine, "complete", flaky)

    async def go():
        batcher = Batcher(engine, max_batch=4, max_wait_s=0.05)
        failed = [batcher.submit(good), batcher.submit(good)]
        errors = []
        for p in failed:
            with pytest.raises(RuntimeError, match="out of memory"):
                await p.result()
            errors.append(True)
        after = await batcher.submit(good).result()
        await batcher.close()
        return errors, after.text

    errors, text = asyncio.run(go())
    assert errors == [True, True] and text == want and calls == [2, 1]
