"""Trajectory data per second, Jacobi against synthetic (jf_core/trajectory/synthetic.py), the kinds taking turns
on the same prompts in one run:

    .venv/bin/python bench/trajectory_speed.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl --prompts 8 --max-new-tokens 96 \
        --batch-sizes 4 8 --repeats 2

For each kind and batch size: answer tokens per second (the fixed points' tokens, what training consumes) and draft
states per second, the fastest of `--repeats` runs. `--caches reserved concatenating` runs each kind on both KV
caches (jf_core/decoding/reserved_cache.py: appending in place, and transformers' `torch.cat` per forward), taking
turns too, with the ratio. Run it alone: threads are `--threads` (default 2).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time

import torch

from jf_core.config import load_profile, parse_overrides
from jf_core.decoding.reserved_cache import concatenating
from jf_core.model_ref import resolve_model
from jf_core.models import load_model
from jf_core.trajectory.collect import collect
from jf_core.trajectory.prompts import load_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", nargs="+", default=["jacobi", "synthetic"], choices=["jacobi", "synthetic"])
    ap.add_argument("--caches", nargs="+", default=["reserved"], choices=["reserved", "concatenating"])
    ap.add_argument("--out", help="JSON with every row")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    model, tok = load_model(resolve_model(profile.model.path), dtype="float32")
    items = load_prompts(profile.prompts.model_copy(update={"limit": args.prompts}), tok).items
    base = profile.trajectory.model_copy(update={"max_new_tokens": args.max_new_tokens})
    best: dict[tuple[str, int, str], dict] = {}
    for rep in range(args.repeats):
        for b in args.batch_sizes:
            # taking turns, the caches' order turned every repeat: a slow minute of the machine hits each alike
            caches = args.caches if rep % 2 == 0 else args.caches[::-1]
            for kind, cache in itertools.product(args.kinds, caches):
                cfg = base.model_copy(update={"kind": kind, "batch_size": b}).collect_config()
                with concatenating() if cache == "concatenating" else contextlib.nullcontext():
                    start = time.perf_counter()
                    result = collect(model, tok, items, cfg, model_hash="bench")
                    seconds = time.perf_counter() - start
                row = {
                    "kind": kind,
                    "batch_size": b,
                    "cache": cache,
                    "seconds": seconds,
                    "tokens_per_s": result.new_tokens / seconds,
                    "states_per_s": sum(len(r["states"]) for r in result.records) / seconds,
                    "blocks": len(result.records),
                    "answers": [r["fixed_point"] for r in result.records],
                }
                if (kind, b, cache) not in best or seconds < best[(kind, b, cache)]["seconds"]:
                    best[(kind, b, cache)] = row
    print("| kind | batch | cache | answer tokens/s | states/s | blocks |\n|---|---|---|---|---|---|")
    for row in best.values():
        print(
            f"| {row['kind']} | {row['batch_size']} | {row['cache']} | {row['tokens_per_s']:.1f} "
            f"| {row['states_per_s']:.1f} | {row['blocks']} |"
        )
    first = args.caches[0]
    for b in args.batch_sizes:
        if set(args.kinds) == {"jacobi", "synthetic"}:
            ratio = best[("synthetic", b, first)]["tokens_per_s"] / best[("jacobi", b, first)]["tokens_per_s"]
            print(f"batch {b}: synthetic gives {ratio:.2f}x Jacobi's answer tokens per second")
        for kind, cache in itertools.product(args.kinds, args.caches[1:]):
            mine, other = best[(kind, b, first)], best[(kind, b, cache)]
            same = "same answers" if mine["answers"] == other["answers"] else "ANSWERS DIFFER"
            print(f"batch {b}, {kind}: the {first} cache gives {mine['tokens_per_s'] / other['tokens_per_s']:.2f}x "
                  f"the {cache} one's tokens per second ({same})")  # fmt: skip
    for row in best.values():
        del row["answers"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(list(best.values()), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
