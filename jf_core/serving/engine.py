"""One batch of completion requests in, the texts greedy AR would write out: the serving core under the registry's
pyfunc and `jf serve`.

Dispatch (`jf_core/decoding/dispatch.py`): a batch runs the model's Jacobi Forcing decode config while its size is at
or below the block's `ar_above_batch` (measured by `jf tune` on the hardware named beside it) and AR above it; AR
once the running mean of accepted tokens per forward falls below the block's break-even TPF; and either prior gives
way to the tokens per second this server has measured for each method at that batch size. Every path is lossless, so
the dispatch changes speed, never text.

Requests in one batch may differ in `max_new_tokens`, stop strings and seeds: the batch decodes to the largest budget
and each completion is cut to its own. Greedy decoding (and sampling, whose noise is fixed per seed and position)
makes a shorter budget's output a prefix of a longer one's, so the cut is exactly what a call with that budget would
return. A batch shares one sampling setting (the batcher groups requests by it); each request has its own seed, so
its text is the AR sample for that seed whatever batch or decoder served it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from jf_core.decoding import Decoder, Dispatch, Sampling, ServingSpec, load_serving_spec
from jf_core.serving.stream import TextStream

Method = Literal["auto", "jacobi", "ar"]


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    sampling: Sampling | None = None  # None: greedy
    seed: int | None = None  # sampling noise; None: a random one

    def __post_init__(self) -> None:
        if self.sampling is not None and self.seed is None:
            self.seed = secrets.randbits(31)


@dataclass
class Completion:
    tokens: list[int]  # generated tokens, EOS included when reached (cut before a stop string)
    text: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    forwards: int  # model calls this request took part in, prefill included
    method: Literal["jacobi", "ar"]

    @property
    def tpf(self) -> float:
        return len(self.tokens) / self.forwards if self.forwards else 0.0


class RequestError(ValueError):
    """A request this model cannot serve (empty or too long a prompt, a budget out of range): the caller's fault."""


class Engine:
    """A loaded model with its decode config and dispatch rule; `complete` serves one batch."""

    def __init__(self, model, tokenizer, spec: ServingSpec, *, name: str = "model", clock=time.perf_counter) -> None:
        from jf_core.models import stop_tokens

        self.model, self.tokenizer, self.spec, self.name = model, tokenizer, spec, name
        self.stop = stop_tokens(model, tokenizer)
        self.eos = self.stop.eos
        self.context_length = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.dispatch = Dispatch()
        self.clock = clock  # times each batch's decoding for the dispatch's tokens/s
        self.dispatched = {"jacobi": 0, "ar": 0}

    @classmethod
    def load(cls, path: str | Path, *, name: str | None = None, **load_kwargs) -> Engine:
        from jf_core.models import load_model

        model, tokenizer = load_model(str(path), **load_kwargs)
        spec = load_serving_spec(path)
        return cls(model, tokenizer, spec, name=name or Path(str(path)).name)

    # -- requests -------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError(f"model {self.name!r} has no chat template: use /v1/completions")
        from jinja2.exceptions import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as err:  # the template refused these messages (raise_exception): the client's to fix
            raise RequestError(f"messages: {err}") from None
        return self.encode(text)

    def check(self, request: Request, max_tokens_limit: int) -> None:
        if not request.prompt:
            raise RequestError("prompt: empty (it must encode to at least one token)")
        if not 1 <= request.max_new_tokens <= max_tokens_limit:
            raise RequestError(f"max_tokens: {request.max_new_tokens} is outside [1, {max_tokens_limit}]")
        if len(request.prompt) + request.max_new_tokens > self.context_length:
            raise RequestError(
                f"prompt: {len(request.prompt)} tokens + max_tokens {request.max_new_tokens} exceed the model's "
                f"context of {self.context_length} tokens"
            )

    # -- dispatch -------------------------------------------------------------------------------------------------

    def choose(self, batch_size: int) -> Decoder:
        prior = self.spec.prior
        if prior is None:
            return self.dispatch.choose(batch_size, None, None, None)
        speedup = prior.speedup_at(batch_size)
        return self.dispatch.choose(batch_size, prior.ar_above_batch, prior.break_even_tpf, speedup)

    # -- decoding -------------------------------------------------------------------------------------------------

    def complete(
        self,
        requests: Sequence[Request],
        *,
        method: Method = "auto",
        block_size: int | None = None,
        on_text: Callable[[int, str], None] | None = None,
    ) -> list[Completion]:
        """Decode one batch; returns one Completion per request, in order. `on_text(i, chunk)` streams request i's
        text as forwards make its tokens final (called from this thread); the chunks join to its `text`."""
        from jf_core.decoding import decode

        budget = max(r.max_new_tokens for r in requests)
        prompts = [r.prompt for r in requests]
        sampling = requests[0].sampling
        if any(r.sampling != sampling for r in requests):
            raise ValueError("a batch shares one sampling setting (the batcher groups requests by it)")
        noise = {"sampling": sampling, "seeds": [r.seed or 0 for r in requests]}
        streams = [TextStream(self.tokenizer, r.max_new_tokens, r.stop, self.eos) for r in requests]

        def on_tokens(i: int, tokens: list[int]) -> None:
            chunk = streams[i].feed(tokens)
            if chunk and on_text is not None:
                on_text(i, chunk)

        chosen = self.choose(len(requests)) if method == "auto" else method
        start = self.clock()
        cfg = replace(self.spec.decode, max_new_tokens=budget)
        if block_size is not None:
            cfg = replace(cfg, block_size=block_size)
        out = decode(self.model, prompts, cfg, decoder=chosen, on_tokens=on_tokens, **noise, stop=self.stop)
        seconds = self.clock() - start
        generated = sum(len(stream.tokens) for stream in streams)
        tpf = out.stats.tpf if chosen == "jacobi" else None
        self.dispatch.observe(chosen, len(requests), generated, seconds, tpf)
        self.dispatched[chosen] += 1
        done = []
        for i, (request, stream, stats) in enumerate(zip(requests, streams, out.stats.sequences, strict=True)):
            tail = stream.finish()
            if tail and on_text is not None:
                on_text(i, tail)
            tokens = stream.tokens
            if stream.text != self.tokenizer.decode(tokens, skip_special_tokens=True):  # cut at a stop string
                tokens = _tokens_of_prefix(self.tokenizer, tokens, len(stream.text))
            reason = stream.finish_reason or "length"
            done.append(Completion(tokens, stream.text, reason, len(request.prompt), stats.forwards, chosen))
        return done


def _tokens_of_prefix(tokenizer, tokens: list[int], chars: int) -> list[int]:
    """The shortest token prefix whose text covers `chars` characters (usage counts what was returned)."""
    for i in range(len(tokens) + 1):
        if len(tokenizer.decode(tokens[:i], skip_special_tokens=True)) >= chars:
            return tokens[:i]
    return tokens
