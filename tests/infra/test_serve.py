"""`jf serve` end to end on the embedded model: Ray Serve in its own private Ray, the official `openai` client.
Completions and chat, plain and streamed, concurrent requests with different budgets and stops batched together:
each answer is what greedy AR writes. Bad requests get a 4xx with OpenAI's error shape and leave the server
serving, a client that disconnects mid-stream too. Every socket the server's process tree listened on was on
127.0.0.1, and SIGINT stops all of it."""

from __future__ import annotations

import json
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import psutil
import pytest

from jf_core.decoding.ar import ar_decode
from jf_core.models import load_model, stop_tokens
from tests.infra.serving import spawn_jf_serve, wait_healthy
from tests.infra.sockets import SocketWatch

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

PROMPTS = [
    "program: a=85; step -8; return f",
    "program: a=3; step +2; return b",
    "program: x=9; step *2; step -1; return z",
    "program: a=7; return a",
]


@pytest.fixture(scope="module")
def server(embedded, tmp_path_factory):
    """`jf serve` on a copy of the embedded model as it ships (its own chat template), on a free loopback port."""
    model, _ = embedded
    directory = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(model.name_or_path, directory)
    proc, url = spawn_jf_serve([str(directory), "--name", "embedded", "--max-tokens-limit", "200"])
    watch = SocketWatch(proc.pid, every=0.5).__enter__()  # from the start: startup may open sockets too
    wait_healthy(proc, url)
    hf, tok = load_model(str(directory))
    yield {"url": url, "client": openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), "model": hf, "tok": tok}
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    said = proc.stdout.read()
    assert "will not be applied" not in said, said[-3000:]  # the options were applied: nothing says otherwise
    assert "failed" not in said and "Error" not in said, said[-3000:]  # a normal stop says nothing alarming
    watch.__exit__(None, None, None)
    assert watch.exposed() == [], f"listening beyond 127.0.0.1: {watch.exposed()}"
    assert any(name == "raylet" for name, _, _ in watch.seen)  # the watch saw the Ray under the server
    time.sleep(5)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "left running"


def greedy(server, prompt: str, budget: int) -> str:
    tok = server["tok"]
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out = ar_decode(server["model"], [ids], max_new_tokens=budget, stop=stop_tokens(server["model"], tok))
    return tok.decode(out.sequences[0], skip_special_tokens=True)


def test_completions_plain_and_streamed_equal_greedy_ar(server):
    client = server["client"]
    out = client.completions.create(model="embedded", prompt=PROMPTS[0], max_tokens=64, temperature=0)
    assert out.choices[0].text == greedy(server, PROMPTS[0], 64) and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 0 and out.usage.prompt_tokens > 0
    assert out.usage.model_extra["tokens_per_forward"] >= 1.0
    stream = client.completions.create(
        model="embedded", prompt=PROMPTS[1], max_tokens=40, stream=True, stream_options={"include_usage": True}
    )
    chunks, usage = [], None
    for event in stream:
        chunks += [c.text for c in event.choices]
        usage = event.usage or usage
    assert "".join(chunks) == greedy(server, PROMPTS[1], 40) and len([c for c in chunks if c]) > 1
    assert usage.completion_tokens <= 40


def test_concurrent_requests_with_different_budgets_and_stops_each_get_their_own_answer(server):
    client = server["client"]
    want_stop = greedy(server, PROMPTS[2], 60)
    stop = want_stop[6:8]
    jobs = [(p, budget, None) for p, budget in zip(PROMPTS, (64, 8, 30, 16), strict=True)] + [(PROMPTS[2], 60, stop)]

    def ask(job):
        prompt, budget, stop = job
        return client.completions.create(model="embedded", prompt=prompt, max_tokens=budget, stop=stop).choices[0]

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    for (prompt, budget, stop_at), answer in zip(jobs, answers, strict=True):
        text = greedy(server, prompt, budget)
        assert answer.text == (text[: text.find(stop_at)] if stop_at else text)
    assert answers[1].finish_reason == "length" and answers[-1].finish_reason == "stop"


def test_sampling_with_a_seed_is_the_ar_sample_of_that_seed_plain_and_streamed(server):
    from jf_core.decoding.sampling import Sampling

    client, tok, model = server["client"], server["tok"], server["model"]
    ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]

    def sample(seed: int) -> str:
        sampling = Sampling(temperature=3.0, top_k=5, top_p=0.98)
        out = ar_decode(model, [ids], max_new_tokens=40, sampling=sampling, seeds=[seed], stop=stop_tokens(model, tok))
        return tok.decode(out.sequences[0], skip_special_tokens=True)

    asked = {"model": "embedded", "prompt": PROMPTS[0], "max_tokens": 40, "temperature": 3.0, "top_p": 0.98}
    texts = [client.completions.create(**asked, seed=s, extra_body={"top_k": 5}).choices[0].text for s in range(4)]
    assert texts == [sample(s) for s in range(4)] and len(set(texts) | {greedy(server, PROMPTS[0], 40)}) > 1
    stream = client.completions.create(**asked, seed=2, extra_body={"top_k": 5}, stream=True)
    assert "".join(c.text for event in stream for c in event.choices) == texts[2]


def test_chat_uses_the_models_chat_template_plain_and_streamed(server):
    """The embedded model's template hands it the user's program (a system message is no part of its task): the
    chat answer is the task's trace, as greedy AR writes it. Messages the template refuses are a 400."""
    from jf_core.toy.task import example_of

    client, tok = server["client"], server["tok"]
    messages = [{"role": "system", "content": "Trace the program."}, {"role": "user", "content": PROMPTS[0]}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = greedy(server, rendered, 64)
    assert rendered == PROMPTS[0] and want == example_of(PROMPTS[0]).answer
    out = client.chat.completions.create(model="embedded", messages=messages, max_tokens=64)
    assert out.choices[0].message.content == want and out.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="embedded", messages=messages, max_tokens=64, stream=True)
    assert "".join(e.choices[0].delta.content or "" for e in stream if e.choices) == want
    prefilled = [*messages, {"role": "assistant", "content": "a=85;"}]
    response = httpx.post(f"{server['url']}/v1/chat/completions", json={"model": "embedded", "messages": prefilled})
    assert response.status_code == 400, response.text
    assert "messages: the embedded model answers a program" in response.json()["error"]["message"]
    assert httpx.get(f"{server['url']}/health").status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "embedded", "prompt": "", "max_tokens": 4}, 400, "prompt: empty"),
        ({"model": "embedded", "prompt": "a=1; " * 200, "max_tokens": 4}, 400, "exceed the model's context"),
        ({"model": "embedded", "prompt": "a", "max_tokens": 0}, 400, "max_tokens: 0 is outside [1, 200]"),
        ({"model": "embedded", "prompt": "a", "max_tokens": 201}, 400, "max_tokens: 201"),
        ({"model": "gpt-4", "prompt": "a"}, 404, "model 'gpt-4' is not served here"),
        ({"model": "embedded", "prompt": "a", "temperature": -1}, 400, "temperature: -1.0 is below 0"),
        ({"model": "embedded", "prompt": "a", "temperature": 1, "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
        ({"model": "embedded", "prompt": "a", "n": 2}, 400, "n: only n=1"),
        ({"model": "embedded"}, 400, "invalid request body"),
        ("{not json", 400, "malformed JSON"),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_the_server_goes_on(server, body, status, says):
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(
        f"{server['url']}/v1/completions", content=content, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"] and response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{server['url']}/health").status_code == 200


def test_a_client_that_disconnects_mid_stream_leaves_the_server_serving(server):
    body = {"model": "embedded", "prompt": PROMPTS[0], "max_tokens": 64, "stream": True}
    with httpx.stream("POST", f"{server['url']}/v1/completions", json=body) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 2:
                break  # hang up after the first chunk
    out = server["client"].completions.create(model="embedded", prompt=PROMPTS[3], max_tokens=16)
    assert out.choices[0].text == greedy(server, PROMPTS[3], 16)
    assert server["client"].models.list().data[0].id == "embedded"
