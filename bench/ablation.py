"""Ablations of Jacobi Forcing at equal compute, on the project's own configs (one shared trajectory store).

    .venv/bin/python bench/ablation.py --out runs/ablation [--steps 600]

Variants: the progressive schedule with the shipped mask (the paper's choice), random and reverse schedules, and
the clean-context mask. Every variant trains the same number of steps on the same trajectories from the same base
model; the table prints accuracy and TPF per block size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jf_core.config import load_profile
from tasks.round import run_round

VARIANTS = {
    "progressive + shipped mask": {"schedule": "progressive", "mask": "shipped"},
    "random + shipped mask": {"schedule": "random", "mask": "shipped"},
    "reverse + shipped mask": {"schedule": "reverse", "mask": "shipped"},
    "progressive + clean-context mask": {"schedule": "progressive", "mask": "clean_context"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    out = Path(args.out)
    rows, base_eval = {}, None
    for name, overrides in VARIANTS.items():
        profile = load_profile(args.profile, training={**overrides, "steps": args.steps})
        slug = name.replace(" + ", "-").replace(" ", "-")
        report = run_round(
            profile, out / slug, base_eval=base_eval, trajectories_dir=out / "trajectories", progress=False
        )
        base_eval = report["base_eval"]
        rows[name] = report
        print(f"{name}: accuracy {report['accuracy']:.3f}, TPF {json.dumps(report['tpf'])}", flush=True)
    sizes = list(next(iter(rows.values()))["tpf"])
    print(f"\n| variant | accuracy | {' | '.join(f'TPF n={n}' for n in sizes)} |")
    print(f"|---|---|{'---|' * len(sizes)}")

    def cells(tpf: dict) -> str:
        return " | ".join(f"{tpf[n]:.2f}" for n in sizes)

    first = next(iter(rows.values()))
    print(f"| base model | {first['base_accuracy']:.3f} | {cells(first['base_tpf'])} |")
    for name, r in rows.items():
        print(f"| {name} | {r['accuracy']:.3f} | {cells(r['tpf'])} |")


if __name__ == "__main__":
    main()
