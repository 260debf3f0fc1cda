"""`jf ablate`: one `jf-ablate` flow run (variants x seeds at equal compute), in process like `jf run`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jf_cli.common import seed_list


def cmd_ablate(args: argparse.Namespace) -> int:
    from jf_cli.orchestrate import flow_process, temporary_server_apart
    from jf_core.atomic import write_text_atomic
    from jf_core.config import parse_overrides
    from jf_core.experiments.ablation import VARIANTS, AblationConfig

    if args.list:
        for name, overrides in VARIANTS.items():
            print(f"{name}: {json.dumps(overrides)}")
        return 0
    flow_process()
    overrides = parse_overrides(args.set or [])
    config = AblationConfig(**{"variants": args.variant} if args.variant else {}, seeds=args.seeds)
    from jacobi_forcing.flows.ablate import jf_ablate

    temporary_server_apart()
    result = jf_ablate(args.profile, ablation_config=config, overrides=overrides or None, model=args.model)
    print()
    print(result.table + result.note)
    if args.out:
        out = Path(args.out)
        write_text_atomic(out / "table.md", result.table + result.note)
        write_text_atomic(out / "results.json", result.model_dump_json(indent=2))
        print(f"written: {out / 'table.md'}, {out / 'results.json'}")
    print(f"MLflow parent run {result.mlflow_run_id} (table, runs, plots/ablation.png)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("ablate", help="variants of a profile at equal compute, several seeds each (jf-ablate)")
    p.add_argument("--profile", default="tiny", help="profile name or YAML path")
    p.add_argument("--model", help="starting model: directory, hub id or models:/<name>@<alias>")
    p.add_argument("--variant", action="append", help="a catalog variant (repeatable; default: all; --list)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override for every variant")
    p.add_argument("--out", help="also write table.md and results.json here")
    p.add_argument("--list", action="store_true", help="print the catalog of variants and exit")
    p.set_defaults(func=cmd_ablate)
