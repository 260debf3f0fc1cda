"""Training's attention on a CPU, forward and backward: torch's kernel (SDPA reading grouped KV heads in place) against
the eager form (`jf_core.decoding.grouped_attention.eager_grouped`), at a draft adapter's training shapes, taking
turns call by call in one process.

    .venv/bin/python bench/training_attention.py --shapes 36x196 57x322 128x526 398x398 600x1024 --repeats 30

Each shape is QUERIES x KEYS for SmolLM2-135M's attention (9 query heads on 3 KV heads of 64), the queries the last
of the keys under a causal bool mask, as a spans step's noisy tails read their context; a gradient is asked of the
query, the keys and the values. Each form's time is its fastest repeat (a neighbour's time slice lands in one
repeat, not in the minimum), in ms, for the forward and the backward apart and together, in each `--dtypes`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from jf_core.decoding.grouped_attention import eager_grouped


def kernel(query, key, value, mask):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def eager(query, key, value, mask):
    return eager_grouped(query, key, value, mask, None)


FORMS = {"kernel": kernel, "eager": eager}


def timed(form, queries: int, keys: int, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> tuple:
    """(forward s, backward s) of one call of `form` at this shape, on fresh leaves."""
    g = torch.Generator().manual_seed(queries * keys)
    query = torch.randn(1, heads, queries, dim, generator=g).to(dtype).requires_grad_(True)
    key, value = (torch.randn(1, kv_heads, keys, dim, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
    mask = torch.ones(1, 1, queries, keys, dtype=torch.bool).tril(keys - queries)
    upstream = torch.randn(1, queries, heads, dim, generator=g).to(dtype)
    start = time.perf_counter()
    out = form(query, key, value, mask)
    middle = time.perf_counter()
    out.backward(upstream)
    return middle - start, time.perf_counter() - middle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["36x196", "57x322", "128x526", "398x398", "600x1024"])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--out", help="JSON of every row")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("| dtype | queries x keys | kernel: forward, backward, both (ms) | eager: forward, backward, both | "
          "kernel / eager |\n|---|---|---|---|---|")  # fmt: skip
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes:
            queries, keys = (int(n) for n in shape.split("x"))
            best = {name: [float("inf")] * 3 for name in FORMS}
            for _ in range(args.repeats):
                for name, form in FORMS.items():  # taking turns call by call
                    f, b = timed(form, queries, keys, dtype, args.heads, args.kv_heads, args.head_dim)
                    best[name] = [min(best[name][0], f), min(best[name][1], b), min(best[name][2], f + b)]
            row = {"dtype": dtype_name, "queries": queries, "keys": keys,
                   **{f"{name}_ms": [round(t * 1e3, 3) for t in ts] for name, ts in best.items()}}  # fmt: skip
            rows.append(row)
            k, e = row["kernel_ms"], row["eager_ms"]
            print(f"| {dtype_name} | {shape} | {k[0]:.2f}, {k[1]:.2f}, {k[2]:.2f} | {e[0]:.2f}, {e[1]:.2f}, "
                  f"{e[2]:.2f} | {k[2] / e[2]:.2f}x |", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
