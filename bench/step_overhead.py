"""Where a decoding forward's time goes: inside the model, and the decoder's own bookkeeping around it.

    .venv/bin/python bench/step_overhead.py MODEL [--prompts 24] [--batch-size 1] [--threads 1] [--top 15]

Runs our AR and the model's saved decode config (`jf decode`'s default path) on the same embedded test prompts,
taking turns, and prints per forward: wall time, time inside `model.forward`, and the rest (the bookkeeping this
bench is about: masks, window building, verification, cache upkeep). `--top` adds cProfile's heaviest functions
outside the model for the Jacobi decoder. Run it alone: the figures are small and a busy neighbour swamps them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=0, help="cProfile's heaviest functions of the Jacobi decoder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from jf_core.decoding import ar_decode, decode, load_decode_config
    from jf_core.models import load_model, stop_tokens
    from jf_core.toy.task import make_split

    model, tok = load_model(args.model, dtype="float32", device="cpu")
    stop = stop_tokens(model, tok)
    cfg = load_decode_config(args.model)
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", args.prompts)]
    batches = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]

    inside = [0.0]
    forward = model.forward

    def timed_forward(*a, **kw):
        start = time.perf_counter()
        try:
            return forward(*a, **kw)
        finally:
            inside[0] += time.perf_counter() - start

    model.forward = timed_forward
    methods = {
        "ar": lambda b: ar_decode(model, b, max_new_tokens=cfg.max_new_tokens, stop=stop),
        "jacobi (saved config)": lambda b: decode(model, b, cfg, stop=stop),
    }
    totals = {name: [0.0, 0.0, 0, 0] for name in methods}  # wall, inside, forwards, tokens
    for _ in range(args.repeats):
        for name, run in methods.items():  # taking turns: drift hits both alike
            for batch in batches:
                inside[0] = 0.0
                out = run(batch)
                s = out.stats
                t = totals[name]
                t[0] += s.decode_seconds + s.prefill_seconds
                t[1] += inside[0]
                t[2] += s.batch_forwards + 1  # + the prefill
                t[3] += s.new_tokens
    print(f"{cfg}\nbatch size {args.batch_size}, {len(prompts)} prompts x {args.repeats}, {args.threads} thread(s)")
    print("| method | ms/forward | in model | outside model | tokens/forward | tokens/s |")
    print("|---|---|---|---|---|---|")
    for name, (wall, model_s, forwards, tokens) in totals.items():
        print(
            f"| {name} | {1e3 * wall / forwards:.3f} | {1e3 * model_s / forwards:.3f} | "
            f"{1e3 * (wall - model_s) / forwards:.3f} | {tokens / forwards / args.batch_size:.2f} | "
            f"{tokens / wall:.0f} |"
        )
    if args.top:
        model.forward = forward
        profiler = cProfile.Profile()
        profiler.enable()
        for batch in batches:
            methods["jacobi (saved config)"](batch)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
