"""`jf bench forward --model DIR`: what one forward of a window of each width costs on this machine, and the TPF a
Jacobi step at that width must reach to beat AR (jf_core/evaluation/forward_cost.py)."""

from __future__ import annotations

import argparse
import json

from jf_cli.common import add_threads_option, model_and_tokenizer, positive, set_threads


def cmd_bench_forward(args: argparse.Namespace) -> int:
    from jf_core.evaluation.forward_cost import window_cost

    set_threads(args)
    model, _ = model_and_tokenizer(args.model)
    try:
        cost = window_cost(model, args.widths, context=args.context, batch=args.batch_size, repeats=args.repeats,
                           gated_slots=args.gated or 0)  # fmt: skip
    except ValueError as err:
        raise SystemExit(f"--gated: {err}") from None
    print(f"{model.name_or_path}: batch {cost['batch']}, {cost['context']}-token context, {cost['threads']} threads")
    if args.gated:
        # The adapter's products in AR steps: what they add to a forward at equal width, over a one-token forward.
        step = cost["ms"][args.widths[0]] if args.widths[0] == 1 else None
        print(f"| width | ms per forward | x width 1 (break-even TPF) | adapter on {args.gated} slots: ms | "
              "its products: ms (AR steps) |")  # fmt: skip
        print("|---|---|---|---|---|")
        for w in args.widths:
            extra = cost["gated_ms"][w] - cost["ms"][w]
            steps = f" ({extra / step:.3f})" if step else ""
            print(f"| {w} | {cost['ms'][w]:.1f} | {cost['ratio_to_width_1'][w]:.2f} | {cost['gated_ms'][w]:.1f} | "
                  f"{extra:.1f}{steps} |")  # fmt: skip
    else:
        print("| width | ms per forward | x width 1 (break-even TPF) |")
        print("|---|---|---|")
        for w in args.widths:
            print(f"| {w} | {cost['ms'][w]:.1f} | {cost['ratio_to_width_1'][w]:.2f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": model.name_or_path, **cost}, fh, indent=2)
    return 0


def register_bench(bench_sub) -> None:
    p = bench_sub.add_parser("forward", help="the cost of one forward at each window width, and AR's break-even TPF")
    p.add_argument("--model", help="local directory, hub id or models:/<name>@<alias> (default: the embedded model)")
    p.add_argument("--widths", type=positive("--widths"), nargs="+", default=[1, 16, 32, 64], help="window widths")
    p.add_argument("--context", type=positive("--context"), default=200, help="tokens in the KV cache")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=1, help="rows per forward")
    p.add_argument("--repeats", type=positive("--repeats"), default=20, help="timed forwards per width (median)")
    p.add_argument(
        "--gated",
        type=positive("--gated"),
        metavar="K",
        help="a model with a draft adapter: each width also with the adapter acting on its last K slots, "
        "the two taking turns: what the adapter's products cost a forward (AR steps with width 1 first)",
    )
    p.add_argument("--json", help="also write the figures here")
    add_threads_option(p)
    p.set_defaults(func=cmd_bench_forward)
