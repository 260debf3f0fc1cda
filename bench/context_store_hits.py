"""How often a run's visits find their context kept (training.context_memory_mb), without a model: a round's packed
examples in the order training visits them (jf_data.batch_orders, one example a micro-step), each context the size
the base's pass makes it (meta tensors of its shapes), through the store's own rule (`ContextStore.keep`: kept while
there is room, nothing dropped) beside the rule it replaced (the least recently seen dropped past the limit):

    .venv/bin/python bench/context_store_hits.py --packed RUN/packed/examples.parquet --memory-mb 8192 --steps 2680

A hit is a context pass the step does not run (about 0.3 s a visit on SmolLM2-135M in bf16 on this CPU; a run's
history logs its `context_miss_s`). The replay of the old rule is checked against a run that trained under it: its
logged `context_hits` are the same count.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections import OrderedDict

import torch

from jf_core.atomic import write_json_atomic
from jf_core.training.context_store import Context, ContextStore, in_own_mapping
from jf_core.training.jf_data import batch_orders, read_packed_share
from jf_core.training.packing import PackedExample


def shaped_context(
    length: int, layers: int, kv_heads: int, head_dim: int, hidden: int, dtypes: dict, device: str = "meta"
) -> Context:
    """A context of `length` positions shaped as the base's pass makes it: on the meta device (no memory) for the
    replay, zeros on the CPU for timing real mappings."""

    def part(name: str, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=getattr(torch, dtypes[name]), device=device)

    return Context(
        keys=tuple(part("keys", kv_heads, length, head_dim) for _ in range(layers)),
        values=tuple(part("values", kv_heads, length, head_dim) for _ in range(layers)),
        hidden=part("hidden", length, hidden),
    )


def churn_ms(length: int, limit_bytes: int, misses: int, shape: dict) -> float:
    """Milliseconds a miss spent under the replaced rule's eviction, its store full (`limit_bytes` of real contexts
    of `length` positions): one mapping dropped and a new one mapped, faulted in and filled (`in_own_mapping`), the
    only work the old rule did that the new one does not besides the passes its lost hits ran."""
    src = shaped_context(length, **shape, device="cpu")
    kept = max(1, limit_bytes // src.nbytes)
    store = [in_own_mapping(src) for _ in range(kept)]
    start = time.perf_counter()
    for i in range(misses):
        store[i % kept] = in_own_mapping(src)
    return (time.perf_counter() - start) / misses * 1e3


def replay(examples: list[PackedExample], limit_bytes: int, visits: int, seed: int, shape: dict) -> dict:
    """Hits under the store's rule and under least-recently-seen eviction over the first `visits` visits."""
    store = ContextStore(limit_bytes)
    recent: OrderedDict[int, int] = OrderedDict()  # the replaced rule: example -> bytes, oldest first
    recent_bytes = hits_kept = hits_recent = 0
    order = batch_orders(examples, 1, seed)

    @functools.cache
    def context(i: int) -> Context:  # built on a miss only, as the step runs the base's pass on a miss only
        return shaped_context(examples[i].context_length, **shape)

    for _ in range(visits):
        (i,) = next(order)
        if i in store.entries:
            hits_kept += 1
        else:
            store.keep(i, context(i))
        if i in recent:
            hits_recent += 1
            recent.move_to_end(i)
        elif (nbytes := context(i).nbytes) <= limit_bytes:
            recent[i] = nbytes
            recent_bytes += nbytes
            while recent_bytes > limit_bytes:
                recent_bytes -= recent.popitem(last=False)[1]
    return {
        "examples": len(examples),
        "visits": visits,
        "limit_mb": limit_bytes / 2**20,
        "kept_examples": len(store.entries),
        "kept_share": len(store.entries) / len(examples),
        "hits_kept": hits_kept,
        "hits_least_recent_dropped": hits_recent,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packed", required=True, help="a run's packed/examples.parquet")
    ap.add_argument("--memory-mb", type=int, required=True, help="training.context_memory_mb")
    ap.add_argument("--steps", type=int, required=True, help="training.steps")
    ap.add_argument("--grad-accum", type=int, default=2, help="training.grad_accum: visits a step at batch 1")
    ap.add_argument("--seed", type=int, default=0, help="training.seed")
    # SmolLM2-135M's shapes, and the dtypes its pass leaves under bf16 autocast (keys after the rotary embedding's
    # fp32, values bf16, the final norm's fp32 hidden): 36,864 bytes a position; a 2,048-question run logged 37,200
    # (its first contexts' kept MB over their positions).
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=576)
    for part, dtype in (("keys", "float32"), ("values", "bfloat16"), ("hidden", "float32")):
        ap.add_argument(f"--{part}-dtype", default=dtype, choices=["bfloat16", "float32"])
    ap.add_argument("--churn", type=int, default=0, metavar="MISSES",
                    help="also time the old rule's eviction over this many misses, its store full of real contexts "
                         "of the examples' median length (--memory-mb of them: it allocates that much)")  # fmt: skip
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    dtypes = {"keys": args.keys_dtype, "values": args.values_dtype, "hidden": args.hidden_dtype}
    shape = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "hidden": args.hidden,
             "dtypes": dtypes}  # fmt: skip
    examples = read_packed_share(args.packed, 0, 1)
    out = replay(examples, args.memory_mb * 2**20, args.steps * args.grad_accum,
                 args.seed, shape)  # fmt: skip
    print(
        f"{out['examples']} examples, {out['visits']} visits, {out['limit_mb']:.0f} MB: "
        f"{out['kept_examples']} kept ({out['kept_share']:.0%}); hits {out['hits_kept']} kept, "
        f"{out['hits_least_recent_dropped']} with the least recently seen dropped"
    )
    if args.churn:
        length = statistics.median_low(ex.context_length for ex in examples)
        out["churn_ms_a_miss"] = churn_ms(length, args.memory_mb * 2**20, args.churn, shape)
        print(f"the old rule's eviction: {out['churn_ms_a_miss']:.2f} ms a miss ({length} positions, a full store)")
    if args.json:
        write_json_atomic(args.json, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
