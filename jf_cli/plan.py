"""`jf plan --profile P [--set section.key=value ...]`: per-GPU memory of a profile's stages, before any work
(jf_core/planning.py). Exit status 1 when the profile's own trajectory or training stage does not fit."""

from __future__ import annotations

import argparse


def cmd_plan(args: argparse.Namespace) -> int:
    from jf_cli.common import args_profile
    from jf_core.planning import format_plan, plan

    profile = args_profile(args)
    shape, source, stages = plan(profile)
    print(format_plan(profile, shape, source, stages))
    return 0 if all(s.fits for s in stages[:2]) else 1


def register(sub) -> None:
    p = sub.add_parser("plan", help="per-GPU memory of a profile's trajectory and training stages, before any work")
    p.add_argument("--profile", default="tiny", help="profile name or YAML path")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    p.set_defaults(func=cmd_plan)
