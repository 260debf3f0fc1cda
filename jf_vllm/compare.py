"""Decoding methods taking turns on the same prompts, in one process of vLLM's environment: vLLM's AR, vLLM with the
Jacobi plugin, vLLM's n-gram method, and this project's own AR and Jacobi decoder on the same weights.

    .venv-vllm/bin/python -m jf_vllm.compare --model DIR --prompts P.json --out R.json [--batch-sizes 1,4,16]

`P.json` is a list of prompts as token ids (the caller applies the chat template, so every method sees the same
ids). Each vLLM method gets one engine, built once and kept; "batch b" submits b prompts at a time, so b requests
are in flight together as in our own decoders' batches. Rounds repeat the whole schedule: every method and batch size
takes its turn in each round, so a drift in the machine's load lands on all of them alike. The result holds, per
method and batch size, the tokens, the wall time per round, and the TPF, tokens / forwards: for vLLM's speculative
methods the forwards are counted in its worker process (worker_stats.py), for vLLM AR each token is one, for ours
the decoder counts them.

`jf bench vllm` (jf_cli) runs this in a subprocess from the main environment; the tests use it too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jf_core.atomic import write_json_atomic
from jf_vllm.launch import KV_CACHE_GIB
from jf_vllm.worker_stats import STATS_DIR_ENV

VLLM_METHODS = ("vllm_ar", "vllm_jacobi", "vllm_ngram")
OUR_METHODS = ("ours_ar", "ours_jacobi")
METHODS = VLLM_METHODS + OUR_METHODS


@dataclass
class Turn:
    seconds: float
    new_tokens: int
    forwards: int  # request-steps (a batch's forward counts once per request in it)
    drafts: int = 0  # vLLM: request-steps that verified drafts (its per-request spec-decode metrics)


@dataclass
class Cell:
    """One method at one batch size: its turns and the tokens of its last round."""

    method: str
    batch_size: int
    turns: list[Turn] = field(default_factory=list)
    sequences: list[list[int]] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return statistics.median(t.new_tokens / t.seconds for t in self.turns)

    @property
    def tpf(self) -> float:
        forwards = sum(t.forwards for t in self.turns)
        return sum(t.new_tokens for t in self.turns) / forwards if forwards else float("nan")


@dataclass(frozen=True)
class Settings:
    model: str
    max_tokens: int = 64
    block_size: int | None = None  # None: the model's stored decode config
    ar_above_batch: int | str | None = "stored"
    ngram: tuple[int, int] = (2, 4)  # vLLM's prompt_lookup_min/max
    eager: bool = False  # vLLM without torch.compile (faster start; the tests)
    threads: int | None = None  # our decoders' torch threads (None: torch's default)
    ignore_eos: bool = False  # vLLM methods only: every request runs to max_tokens (the gating test's fixed batch)


def _vllm_engine(settings: Settings, method: str, max_num_seqs: int):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    from vllm import LLM

    from jf_vllm.spec_config import speculative_config

    spec = None
    if method == "vllm_jacobi":
        spec = speculative_config(
            settings.model,
            block_size=settings.block_size,
            ar_above_batch=settings.ar_above_batch,
            max_num_seqs=max_num_seqs,
        )
    elif method == "vllm_ngram":
        k = speculative_config(settings.model, block_size=settings.block_size)["num_speculative_tokens"]
        lo, hi = settings.ngram
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    return LLM(
        model=settings.model,
        dtype="float32",
        speculative_config=spec,
        max_num_seqs=max_num_seqs,
        seed=0,
        # (vLLM refuses the per-request metrics without speculative decoding)
        per_request_spec_decode_metrics="summary" if spec is not None else "none",
        enforce_eager=settings.eager,
    )


def _draft_steps(outputs) -> int:
    """Request-steps that verified drafts, from vLLM's per-request spec-decode metrics."""
    return sum(sum(o.outputs[0].spec_decode_metrics.histogram) for o in outputs if o.outputs[0].spec_decode_metrics)


def _worker_forwards(stats_dir: str) -> int:
    from jf_vllm.worker_stats import settled

    return sum(s["forwards"] for s in settled(stats_dir))


def _vllm_runner(llm, settings: Settings, stats_dir: str, speculative: bool):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=settings.max_tokens, ignore_eos=settings.ignore_eos)

    def run(batch: list[list[int]]) -> tuple[list[list[int]], Turn]:
        # Only this engine runs now, so the change of the sum over every worker's counters is its own.
        forwards0 = _worker_forwards(stats_dir) if speculative else 0
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        seqs = [list(o.outputs[0].token_ids) for o in outs]
        tokens = sum(map(len, seqs))
        forwards = _worker_forwards(stats_dir) - forwards0 if speculative else tokens
        return seqs, Turn(seconds, tokens, forwards, _draft_steps(outs))

    return run


def _our_runner(settings: Settings, method: str):
    import torch

    from jf_core.decoding import ar_decode, decode, load_decode_config
    from jf_core.model_dir import ServingPrior, read_block
    from jf_core.models import load_model, stop_tokens

    if settings.threads:
        torch.set_num_threads(settings.threads)
    model, tokenizer = load_model(settings.model, dtype="float32")
    stop = stop_tokens(model, tokenizer)
    config = load_decode_config(settings.model, block_size=settings.block_size, max_new_tokens=settings.max_tokens)
    prior = ServingPrior.of_block(read_block(settings.model))
    stored = prior.ar_above_batch if prior else None
    above = stored if settings.ar_above_batch == "stored" else settings.ar_above_batch

    def run(batch: list[list[int]]) -> tuple[list[list[int]], Turn]:
        start = time.perf_counter()
        with torch.inference_mode():
            if method == "ours_ar":
                out = ar_decode(model, batch, max_new_tokens=settings.max_tokens, stop=stop)
            else:
                out = decode(model, batch, config, ar_above_batch=above, stop=stop)
        seconds = time.perf_counter() - start
        return out.sequences, Turn(seconds, out.stats.new_tokens, out.stats.forwards)

    return run


def compare(
    settings: Settings,
    prompts: list[list[int]],
    methods: list[str],
    batch_sizes: list[int],
    rounds: int = 1,
    say: Callable[[str], None] = print,
) -> list[Cell]:
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"methods: unknown {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
    if not prompts:
        raise ValueError("prompts: none given")
    if settings.ignore_eos and set(methods) & set(OUR_METHODS):
        raise ValueError("ignore_eos: only vLLM's methods can ignore EOS; drop ours_* from the methods")
    # vLLM's workers inherit this and write their counters there (worker_stats.py); a caller may set its own.
    stats_dir = os.environ.setdefault(STATS_DIR_ENV, tempfile.mkdtemp(prefix="jf-vllm-stats-"))
    engines, runners = [], {}
    for method in methods:
        say(f"loading {method}")
        if method in VLLM_METHODS:
            llm = _vllm_engine(settings, method, max(batch_sizes))
            engines.append(llm)
            runners[method] = _vllm_runner(llm, settings, stats_dir, speculative=method != "vllm_ar")
        else:
            runners[method] = _our_runner(settings, method)
    cells = {(m, b): Cell(m, b) for m in methods for b in batch_sizes}
    # Warm-up: one small batch per method (first calls allocate, compile and fill caches).
    for method in methods:
        runners[method](prompts[: min(batch_sizes)])
    for r in range(rounds):
        for b in batch_sizes:
            for method in methods:
                cell, seqs, turn = cells[method, b], [], Turn(0.0, 0, 0)
                for i in range(0, len(prompts), b):
                    out, t = runners[method](prompts[i : i + b])
                    seqs += out
                    turn = Turn(
                        turn.seconds + t.seconds,
                        turn.new_tokens + t.new_tokens,
                        turn.forwards + t.forwards,
                        turn.drafts + t.drafts,
                    )
                cell.turns.append(turn)
                cell.sequences = seqs
                say(f"round {r + 1}/{rounds} batch {b} {method}: {turn.new_tokens / turn.seconds:.1f} tok/s")
    for llm in engines:
        llm.llm_engine.engine_core.shutdown()
    del engines
    gc.collect()
    return list(cells.values())


def report(cells: list[Cell], reference: str = "vllm_ar") -> dict:
    """Rows with TPS, TPF, speedup against vLLM AR at the same batch size, the step cost that with the TPF makes
    the speedup, and the fraction of prompts whose text is vLLM AR's."""
    by = {(c.method, c.batch_size): c for c in cells}
    rows = []
    for c in cells:
        ref = by.get((reference, c.batch_size))
        same = [a == b for a, b in zip(c.sequences, ref.sequences, strict=True)] if ref else []
        rows.append(
            {
                "method": c.method,
                "batch_size": c.batch_size,
                "tps": c.tps,
                "tpf": c.tpf,
                "speedup_vs_vllm_ar": c.tps / ref.tps if ref else None,
                # What one forward costs against one of vLLM's AR steps: speedup = TPF / step cost.
                "step_cost_vs_vllm_ar": c.tpf * ref.tps / c.tps if ref else None,
                "identical_to_vllm_ar": sum(same) / len(same) if same else None,
                "drafts": sum(t.drafts for t in c.turns),
                "turns": [asdict(t) for t in c.turns],
                "sequences": c.sequences,
            }
        )
    return {"rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jf_vllm.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--prompts", required=True, help="JSON list of prompts as token-id lists")
    parser.add_argument("--out", required=True, help="where to write the result (JSON)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of: " + ", ".join(METHODS))
    parser.add_argument("--batch-sizes", default="1,4,16", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=1, help="times the whole schedule repeats")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt at most")
    parser.add_argument("--block-size", type=int, default=None, help="Jacobi block size (default: the stored one)")
    parser.add_argument("--ar-above-batch", default="stored", help="'stored', 'none' or a batch size")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of our own decoders")
    parser.add_argument("--ignore-eos", action="store_true", help="vLLM methods run every request to --max-tokens")
    args = parser.parse_args(argv)
    prompts = json.loads(Path(args.prompts).read_text())
    if not isinstance(prompts, list) or not all(isinstance(p, list) and p for p in prompts):
        raise SystemExit(f"{args.prompts}: expected a JSON list of non-empty token-id lists")
    above = args.ar_above_batch
    above = None if above == "none" else above if above == "stored" else int(above)
    settings = Settings(
        model=args.model,
        max_tokens=args.max_tokens,
        block_size=args.block_size,
        ar_above_batch=above,
        eager=args.eager,
        threads=args.threads,
        ignore_eos=args.ignore_eos,
    )
    cells = compare(
        settings,
        prompts,
        args.methods.split(","),
        [int(b) for b in args.batch_sizes.split(",")],
        rounds=args.rounds,
        say=lambda line: print(line, flush=True),
    )
    # The pid shows the tests that the drafter's counters come from another (vLLM's worker) process.
    result = {"settings": asdict(settings), "pid": os.getpid(), **report(cells)}
    write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
