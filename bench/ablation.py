"""Ablations of Jacobi Forcing at equal compute, on the project's own configs, each variant a `jf-round` flow run.

    .venv/bin/python bench/ablation.py [--profile tiny] [--steps 600]

Variants: the progressive schedule with the shipped mask (the paper's choice), random and reverse schedules, and
the clean-context mask. Every variant trains the same number of steps on the same trajectories (rounds that differ
in training alone share one trajectory store) from the same base model, and registers under its own model name
(`jf-ablation-<variant>`), never the profile's; the table prints accuracy and TPF per block size.
"""

from __future__ import annotations

import argparse
import json

VARIANTS = {
    "progressive + shipped mask": {"schedule": "progressive", "mask": "shipped"},
    "random + shipped mask": {"schedule": "random", "mask": "shipped"},
    "reverse + shipped mask": {"schedule": "reverse", "mask": "shipped"},
    "progressive + clean-context mask": {"schedule": "progressive", "mask": "clean_context"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    from jf_cli.orchestrate import _prefect_env

    _prefect_env()  # before Prefect is imported: the flow runs on the project's own Prefect home
    from jacobi_forcing.flows.round import jf_round

    rows = {}
    for name, overrides in VARIANTS.items():
        slug = name.replace(" + ", "-").replace(" ", "-")
        report = jf_round(
            args.profile,
            overrides={
                "training": {**overrides, "steps": args.steps},
                "registry": {"model_name": f"jf-ablation-{slug}"},
            },
        )
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
