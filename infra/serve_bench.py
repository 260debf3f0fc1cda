"""`jf bench serve`: the server under load, on loopback only. One Ray Serve instance hosts the same model three
times (`/auto`: the artifact's dispatch; `/jacobi`: forced Jacobi Forcing decoding; `/ar`: forced AR); for each
number of concurrent clients the three take turns on the same requests (the fastest of `repeats` runs counts), so
a drifting machine does not pick the winner. Every request streams (time to first token is measured at the first
text chunk) and must end with exactly one finish reason and one `[DONE]`; the texts of the three must agree
(every path is lossless).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace

MODES = ("auto", "jacobi", "ar")


@dataclass
class LoadResult:
    mode: str
    clients: int
    requests: int
    completed: int  # requests that got exactly one complete answer
    tokens: int
    seconds: float
    p50_latency_s: float
    p99_latency_s: float
    p50_ttft_s: float
    texts: list[str]
    batches: dict | None = None  # the server's batches by decoder over this level (its /health), e.g. auto's choices

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


async def _one(client, url: str, name: str, prompt: str, max_tokens: int) -> tuple[str, int, float, float, bool]:
    body = {
        "model": name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first, text, tokens, finishes, done = None, [], 0, 0, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            return "", 0, time.perf_counter() - start, 0.0, False
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                text.append(choice["text"])
                finishes += choice["finish_reason"] is not None
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return "".join(text), tokens, latency, first or latency, finishes == 1 and done == 1


async def drive(url: str, name: str, prompts: list[str], clients: int, max_tokens: int, mode: str) -> LoadResult:
    """`clients` concurrent clients send `prompts` (one request each, in order) to `url` and stream the answers."""
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(prompts)):
        queue.put_nowait(i)
    results: dict[int, tuple] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_loop(client) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results[i] = await _one(client, url, name, prompts[i], max_tokens)

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    seconds = time.perf_counter() - start
    ordered = [results[i] for i in range(len(prompts))]
    latencies = sorted(r[2] for r in ordered)
    return LoadResult(
        mode=mode,
        clients=clients,
        requests=len(prompts),
        completed=sum(r[4] for r in ordered),
        tokens=sum(r[1] for r in ordered),
        seconds=seconds,
        p50_latency_s=statistics.median(latencies),
        p99_latency_s=latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        p50_ttft_s=statistics.median(r[3] for r in ordered),
        texts=[r[0] for r in ordered],
    )


def bench_serve(
    options,
    prompts: list[str],
    *,
    clients: list[int],
    requests_per_level: int,
    max_tokens: int,
    repeats: int = 1,
    port: int | None = None,
    progress=print,
) -> list[LoadResult]:
    """Host the model as /auto, /jacobi and /ar in one Serve (private loopback Ray) and load each in turn."""
    from ray import serve

    from jacobi_forcing.infra.ray_cluster import ray_session
    from jacobi_forcing.infra.serve_app import JFServer, give_proxies_time
    from jacobi_forcing.infra.stack import free_port

    port = port or free_port()
    out: list[LoadResult] = []
    give_proxies_time()
    with ray_session():
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            for mode in MODES:
                # num_cpus=0: three replicas on a small machine; only one is loaded at a time.
                deployment = JFServer.options(name=f"jf-{mode}", ray_actor_options={"num_cpus": 0})
                serve.run(
                    deployment.bind(asdict(replace(options, method=mode))),
                    name=mode,
                    route_prefix=f"/{mode}",
                    blocking=False,
                )
            for level in clients:
                batch = [prompts[i % len(prompts)] for i in range(max(requests_per_level, level))]
                before = {mode: _dispatched(port, mode) for mode in MODES}
                best: dict[str, LoadResult] = {}
                for rep in range(repeats + 1):  # the first round warms every path and is not counted
                    for mode in MODES:
                        url = f"http://127.0.0.1:{port}/{mode}"
                        result = asyncio.run(drive(url, options.name, batch, level, max_tokens, mode))
                        if rep and (mode not in best or result.seconds < best[mode].seconds):
                            best[mode] = result
                for mode in MODES:
                    after = _dispatched(port, mode)
                    best[mode].batches = {k: after[k] - before[mode].get(k, 0) for k in after}
                    progress(
                        f"{level:>3} clients  {mode:<6} {best[mode].tokens_per_second:8.1f} tok/s  "
                        f"{best[mode].completed}/{best[mode].requests} complete  batches {best[mode].batches}"
                    )
                out.extend(best[m] for m in MODES)
        finally:
            serve.shutdown()
    return out


def _dispatched(port: int, mode: str) -> dict:
    import httpx

    return httpx.get(f"http://127.0.0.1:{port}/{mode}/health", timeout=30).json()["dispatched"]


def format_table(results: list[LoadResult]) -> str:
    by = {(r.clients, r.mode): r for r in results}
    lines = [
        "| clients | method | tokens/s | vs forced AR | p50 latency s | p99 latency s | p50 TTFT s | complete | "
        "batches Jacobi/AR |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ar = by[(r.clients, "ar")].tokens_per_second
        ratio = r.tokens_per_second / ar if ar else 0.0
        lines.append(
            f"| {r.clients} | {r.mode} | {r.tokens_per_second:.1f} | {ratio:.2f}x | {r.p50_latency_s:.3f} | "
            f"{r.p99_latency_s:.3f} | {r.p50_ttft_s:.3f} | {r.completed}/{r.requests} | {_split(r.batches)} |"
        )
    return "\n".join(lines)


def _split(batches: dict | None) -> str:
    return f"{batches.get('jacobi', 0)}/{batches.get('ar', 0)}" if batches else "-"


def check(results: list[LoadResult]) -> list[str]:
    """Problems: a request without exactly one complete answer, or methods that disagree on a text."""
    problems = [
        f"{r.mode} at {r.clients} clients: {r.requests - r.completed} lost" for r in results if r.completed < r.requests
    ]
    by_level: dict[int, dict[str, list[str]]] = {}
    for r in results:
        by_level.setdefault(r.clients, {})[r.mode] = r.texts
    for level, texts in by_level.items():
        for mode in ("auto", "jacobi"):
            if mode in texts and "ar" in texts and texts[mode] != texts["ar"]:
                problems.append(f"{mode} at {level} clients: texts differ from AR's")
    return problems
