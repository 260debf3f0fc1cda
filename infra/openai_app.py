"""The OpenAI-compatible HTTP API over the serving core (`jf_core/serving`): `/v1/completions`,
`/v1/chat/completions` (the tokenizer's chat template), `/v1/models`, `/health`; server-sent events when `stream`
is set, chunks as tokens become final; `usage` with prompt and completion tokens and the request's TPF.

Decoding is greedy unless a request sets `temperature` > 0 (OpenAI's default is 1; this server's is greedy, the
text the model's AR decoding writes). With a temperature it samples exactly (`jf_core/decoding/sampling.py`):
`top_p`, `top_k` (as vLLM accepts it) and `seed` apply, and a request with a seed gets the AR sample for that seed
whatever batch or decoder serves it. Errors use OpenAI's shape:
`{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}`.

`build_app(batcher, name)` returns a FastAPI app; `infra/serve_app.py` runs it as a Ray Serve deployment.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from jf_core.decoding import Sampling
from jf_core.serving.batcher import Batcher
from jf_core.serving.engine import Completion, RequestError
from jf_core.serving.engine import Request as EngineRequest


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields we do not use (user, seed, ...)

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's; vLLM's, which clients pass as extra_body
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None


class CompletionBody(_Body):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def build_app(batcher: Batcher, name: str, *, max_tokens_limit: int = 1024) -> FastAPI:
    """The OpenAI-compatible app over `batcher`'s engine, serving the model `name`."""
    app = FastAPI(title="jacobi-forcing", docs_url=None, redoc_url=None)
    _error_handlers(app)
    _info_routes(app, batcher.engine, name)
    asks = _Asks(batcher.engine, name, max_tokens_limit)
    _completion_route(app, batcher, asks)
    _chat_route(app, batcher, asks)
    return app


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _error(err.status, err.message, err.param, err.code)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"malformed JSON body: {first.get('ctx', {}).get('error', 'cannot parse it')}")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return _error(400, f"invalid request body: {where}: {first.get('msg', 'malformed')}", where)


def _info_routes(app: FastAPI, engine, name: str) -> None:
    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "model": name,
            "dispatched": engine.dispatched,
            "tokens_per_s": engine.dispatch.summary(),  # what the dispatch measured, per method and batch bucket
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "jacobi-forcing"}]}


class _Asks:
    """What a request body asks of this server beyond its prompt (model, budget, stop strings, sampling, seed: the
    EngineRequest's fields), refused by name where this server cannot give it."""

    def __init__(self, engine, name: str, max_tokens_limit: int) -> None:
        self.engine, self.name, self.max_tokens_limit = engine, name, max_tokens_limit

    def common(self, body: _Body, default_budget: int) -> dict:
        if body.model != self.name:
            raise ApiError(
                404,
                f"model {body.model!r} is not served here (this server serves {self.name!r})",
                "model",
                "model_not_found",
            )
        if body.n != 1:
            raise ApiError(400, "n: only n=1 is supported", "n")
        budget = default_budget if body.max_tokens is None else body.max_tokens
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        if len(stop) > 4:
            raise ApiError(400, "stop: at most 4 stop strings", "stop")
        return {"max_new_tokens": budget, "stop": stop, "sampling": _sampling_of(body), "seed": body.seed}

    def request(self, prompt: list[int], asked: dict) -> EngineRequest:
        request = EngineRequest(prompt, **asked)
        try:
            self.engine.check(request, self.max_tokens_limit)
        except RequestError as err:
            param = "max_tokens" if str(err).startswith("max_tokens") else "prompt"
            raise ApiError(400, str(err), param) from None
        return request


def _sampling_of(body: _Body) -> Sampling | None:
    if body.temperature is not None and body.temperature < 0:
        raise ApiError(400, f"temperature: {body.temperature} is below 0", "temperature")
    try:
        return Sampling.of(body.temperature, body.top_k, body.top_p)  # None (greedy) at temperature 0
    except ValueError as err:
        raise ApiError(400, str(err), str(err).split(" ", 1)[0]) from None


def _usage(done: list[Completion]) -> dict:
    prompt = sum(c.prompt_tokens for c in done)
    completion = sum(len(c.tokens) for c in done)
    forwards = sum(c.forwards for c in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "tokens_per_forward": round(completion / forwards, 4) if forwards else 0.0,
    }


def _completion_route(app: FastAPI, batcher: Batcher, asks: _Asks) -> None:
    engine, name = batcher.engine, asks.name

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
        asked = asks.common(body, 16)  # OpenAI's default budget for completions
        if body.echo or body.logprobs:
            raise ApiError(400, "echo and logprobs are not supported", "echo" if body.echo else "logprobs")
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not prompts:
            raise ApiError(400, "prompt: empty list", "prompt")
        if body.stream and len(prompts) > 1:
            raise ApiError(400, "prompt: stream one prompt per request", "prompt")
        seed = asked["seed"]  # prompt i of a list gets seed + i: distinct samples, each reproducible
        requests = [
            asks.request(engine.encode(p), asked | ({"seed": seed + i} if seed is not None else {}))
            for i, p in enumerate(prompts)
        ]
        pending = [batcher.submit(r) for r in requests]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))

            def chunk(text: str, reason: str | None) -> dict:
                choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
                return {**head, "object": "text_completion", "choices": [choice]}

            return _sse(pending[0], chunk, head | {"object": "text_completion"}, include_usage, _usage)
        done = [await p.result() for p in pending]
        choices = [
            {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None} for i, c in enumerate(done)
        ]
        return {**head, "object": "text_completion", "choices": choices, "usage": _usage(done)} | _jf(done)


def _chat_route(app: FastAPI, batcher: Batcher, asks: _Asks) -> None:
    engine, name = batcher.engine, asks.name

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody):
        asked = asks.common(body, asks.max_tokens_limit)
        if body.max_completion_tokens is not None:
            asked["max_new_tokens"] = body.max_completion_tokens
        try:
            prompt = engine.chat_prompt([m.model_dump() for m in body.messages])
        except RequestError as err:
            raise ApiError(400, str(err), "messages") from None
        pending = batcher.submit(asks.request(prompt, asked))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            first = [True]

            def chunk(text: str, reason: str | None) -> dict:
                delta = {"content": text} if reason is None or text else {}
                if first[0]:
                    delta, first[0] = {"role": "assistant", **delta}, False
                choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
                return {**head, "object": "chat.completion.chunk", "choices": [choice]}

            return _sse(pending, chunk, head | {"object": "chat.completion.chunk"}, include_usage, _usage)
        done = await pending.result()
        message = {"role": "assistant", "content": done.text}
        choice = {"index": 0, "message": message, "finish_reason": done.finish_reason, "logprobs": None}
        return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage([done])} | _jf([done])


def _jf(done: list[Completion]) -> dict:
    """How the answer was decoded (beside OpenAI's fields; clients ignore it)."""
    return {"jacobi_forcing": {"method": done[0].method, "forwards": sum(c.forwards for c in done)}}


def _sse(pending, chunk, head: dict, include_usage: bool, usage) -> StreamingResponse:
    async def events():
        async for text in pending.stream():
            yield _event(chunk(text, None))
        done = pending.completion
        yield _event(chunk("", done.finish_reason))
        if include_usage:
            yield _event({**head, "choices": [], "usage": usage([done])})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
