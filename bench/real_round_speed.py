"""A round's base and trained model side by side: our AR and plain Jacobi at the profile's block sizes, tokens per
second at each batch size, both models' methods taking turns in one run on the profile's held-out questions.

    .venv/bin/python bench/real_round_speed.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl \
        --base BASE_DIR --trained ROUND_DIR/model --num-prompts 8 --batch-sizes 4 --out speed.json

The round's evaluation times batch 1 only (its speed pass); this adds the other batch sizes. Speedups are against
the base model's AR; identity is each model's methods against that model's own greedy AR. Threads: `--threads`
(default 2, the round's evaluation count on this 2-core machine; run it alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from jf_core.config import load_profile, parse_overrides
from jf_core.evaluation.evaluate import eval_set
from jf_core.evaluation.method import AR
from jf_core.evaluation.methods import build_methods
from jf_core.evaluation.speed import bench
from jf_core.models import load_model, stop_tokens
from jf_core.trajectory.prompts import PromptFormat, load_prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m", help="its evaluation set, block sizes and lengths")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--base", required=True, help="the round's input model directory")
    ap.add_argument("--trained", required=True, help="the round's trained model directory")
    ap.add_argument("--num-prompts", type=int, default=8, help="questions")
    ap.add_argument(
        "--split",
        help="the prompt file's split to time: default the evaluation's held-out questions; `train` times the "
        "questions trained on (bench/mechanism.py's first --train N)",
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4], help="one run per batch size")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--out", required=True, help="JSON with every row")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    methods, tokenizer = {}, None
    for tag, path in (("base", args.base), ("trained", args.trained)):
        model, tokenizer = load_model(path, dtype=profile.model.dtype)
        e = profile.evaluation
        stop = stop_tokens(model, tokenizer)
        methods |= build_methods(model, stop, e.max_new_tokens, block_sizes=e.block_sizes, model_tag=tag)
    if args.split:
        chosen = profile.prompts.model_copy(update={"split": args.split, "limit": args.num_prompts})
        prompts = [p.token_ids for p in load_prompts(chosen, tokenizer).items]
    else:
        fmt = PromptFormat.of(profile.prompts)
        prompts = eval_set(profile.evaluation, tokenizer, fmt, part="confirmation", limit=args.num_prompts).prompts
    twins = {m: AR.of(m.model) for m in methods}  # each model against its own greedy AR
    results: dict[int, dict] = {}
    for b in args.batch_sizes:
        rows = bench(
            methods,
            prompts,
            batch_size=b,
            reference=None,
            baseline_ar=AR.of("base"),
            same_output_as=twins,
            progress=print,
        )
        results[b] = {
            r.name: {
                "tpf": r.tpf,
                "tps": r.tps,
                "x_base_ar": r.speedup_vs_ar,
                "identical_to_own_ar": r.identical_fraction,
                "tokens": r.new_tokens,
            }
            for r in rows
        }
        for method, r in results[b].items():
            print(
                f"batch {b} {method}: TPF {r['tpf']:.3f}, {r['tps']:.1f} tokens/s, {r['x_base_ar']:.2f}x base AR, "
                f"identical {r['identical_to_own_ar']:.2f}"
            )
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
