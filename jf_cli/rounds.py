"""`jf round` (one Jacobi Forcing round, locally, no Prefect) and `jf rounds` (progressive rounds)."""

from __future__ import annotations

import argparse
import json


def _print_report(report: dict) -> None:
    tpf = ", ".join(f"n={n}: {v:.2f}" for n, v in report["tpf"].items())
    base = ", ".join(f"n={n}: {v:.2f}" for n, v in report["base_tpf"].items())
    print(
        f"[n={report['block_size']}] accuracy {report['accuracy']:.3f} (base {report['base_accuracy']:.3f}); "
        f"TPF {tpf} (base {base}); speedup vs AR {report['speedup_vs_ar']:.2f}x at n={report['speedup_block_size']}; "
        f"trained {report['train_seconds']:.0f} s"
    )


def cmd_round(args: argparse.Namespace) -> int:
    from jf_core.config import load_profile
    from tasks.round import run_round

    profile = load_profile(
        args.profile,
        trajectory={"block_size": args.block_size},
        prompts={"limit": args.num_prompts},
        training={"steps": args.steps},
    )
    report = run_round(profile, args.out, model_in=args.model)
    _print_report(report)
    print(f"report: {args.out}/report.json")
    return 0


def cmd_rounds(args: argparse.Namespace) -> int:
    from jf_core.config import load_profile
    from tasks.round import run_rounds

    profile = load_profile(args.config)
    reports = run_rounds(profile, args.out)
    for r in reports:
        _print_report(r)
    summary = [
        {k: r[k] for k in ("block_size", "accuracy", "base_accuracy", "tpf", "speedup_vs_ar", "train_seconds")}
        for r in reports
    ]
    print(json.dumps(summary, indent=1))
    return 0


def register(sub) -> None:
    from jf_cli.main import _positive

    p = sub.add_parser("round", help="one Jacobi Forcing round: trajectories -> pack -> train -> evaluate")
    p.add_argument("--profile", default="tiny")
    p.add_argument("--out", required=True)
    p.add_argument("--model", help="starting model (default: the profile's)")
    p.add_argument("--block-size", type=_positive("--block-size"))
    p.add_argument("--num-prompts", type=_positive("--num-prompts"))
    p.add_argument("--steps", type=_positive("--steps"))
    p.set_defaults(func=cmd_round)
    p = sub.add_parser("rounds", help="progressive rounds listed in a profile's `rounds:`")
    p.add_argument("--config", required=True, help="profile name or YAML path with a `rounds:` list")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_rounds)
