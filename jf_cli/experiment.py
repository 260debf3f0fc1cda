"""`jf experiment`: variants of a round's data and training from one model, each through the round's own stages,
reported as TPF on the trained questions and on held-out ones beside the text's identity with the base model
(jf_core/experiments/). The mechanism check on a real model is one:

    jf experiment --profile smollm2-135m --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl \
        --train 8 --held-out 8 --max-new-tokens 96 --variant 'fixed:{}' \
        --variant 'each_visit:{"state_pick": "each_visit"}' --out mechanism.json

Each `--variant NAME:JSON` is a set of overrides on top of the profile (and `--set`): `{"training": {...},
"trajectory": {...}}`, or training's fields alone (`{"lr": 1e-3}`); `"from": "NAME"` starts it from an earlier
variant's trained model. `--seeds 0,1` runs each variant once per seed. Every variant is a round's stages in its own
directory under the profile's runs directory, so the same command run again reads back what is done and goes on
where it died. Rows go to `--out` as they finish (JSON lines, with each variant's training history). Trajectories
are collected in this process, one model (no Ray). `--from-json FILE` plots or logs an earlier run's rows
(`--plot`, `--mlflow`). bench/mechanism.py holds the GPU recipe and what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from jf_cli.common import (
    UsageError,
    add_profile_options,
    args_profile,
    model_path,
    named_overrides,
    positive,
    seed_list,
)


def cmd_experiment(args: argparse.Namespace) -> int:
    import torch

    from jf_core.experiments.measure import Measure
    from jf_core.experiments.questions import question_sets
    from jf_core.experiments.run import run_experiment, table
    from jf_core.experiments.variants import sectioned, seeded
    from jf_core.model_import import random_weights_beside
    from jf_core.models import load_model
    from jf_core.round.collection import collect_in_process

    if args.from_json is None and not (args.variant and args.out):
        raise UsageError("--variant and --out are required (or --from-json FILE to plot or log an earlier run's rows)")
    layouts = tuple((name, _layout(name, fields)) for name, fields in args.layout)  # refused before any work
    torch.set_num_threads(args.threads)
    if args.from_json is not None:
        rows = [json.loads(line) for f in args.from_json for line in f.read_text().splitlines() if line.strip()]
        _publish(args_profile(args), rows, args.plot, args.mlflow, " ".join(map(str, args.from_json)))
        return 0
    profile = experiment_profile(args)
    model = model_path(args.model, profile)
    if args.random_weights:
        model = str(random_weights_beside(model))
    _, tok = load_model(model, dtype="float32")
    trained, held, score = question_sets(profile, tok, args.held_out, args.held_out_field, args.measure_trained)
    measure = Measure(
        trained=trained,
        held_out=held,
        block_size=profile.trajectory.block_size,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        draft_init=profile.trajectory.draft_init,
        score=score,
        more_block_sizes=tuple(args.more_block_sizes),
        multiblock=args.multiblock,
        layouts=layouts,
    )
    out = Path(args.out)
    out.write_text("")

    def on_row(row) -> None:
        with out.open("a") as f:
            f.write(json.dumps(row.summary()) + "\n")
        print(table([row]).splitlines()[-1], flush=True)

    print(table([]), flush=True)
    collect = partial(collect_in_process, say=lambda line: print(line, flush=True))
    variants = seeded({name: sectioned(overrides) for name, overrides in args.variant}, args.seeds)
    rows = run_experiment(profile, model, variants, measure, collect=collect, on_row=on_row, progress=True)
    print("\n" + table(rows))
    _publish(profile, [r.summary() for r in rows], args.plot, args.mlflow, " ".join(sys.argv[1:]))
    return 0


def _layout(name: str, fields: dict):
    """A `--layout`'s decode config: its JSON fields over JFDecodeConfig's defaults (the paper's)."""
    from jf_core.decoding import JFDecodeConfig

    if not name.isidentifier():  # it tags the layout's table row and JSON key
        raise UsageError(f"--layout {name!r}: a name of letters, digits and underscores")
    try:
        return JFDecodeConfig(**fields)
    except (TypeError, ValueError) as err:
        raise UsageError(f"--layout {name}: {err}") from None


def experiment_profile(args: argparse.Namespace):
    """The profile the command's flags describe: the trained questions are the prompt file's train split (`--train`
    of them), their trajectories run to `--max-new-tokens` in batches of `--collect-batch-size` (a shard each, so
    the batch is whole), and every model decodes and trains on `--device` with `--threads`."""
    collect = args.collect_batch_size or args.batch_size
    return args_profile(
        args,
        prompts={"split": "train", "limit": args.train},
        trajectory={"max_new_tokens": args.max_new_tokens, "batch_size": collect, "shard_size": collect},
        model={"device": args.device},
        compute={"threads": args.threads},
    )


def _publish(profile, rows: list[dict], plot: Path | None, mlflow: bool, source: str) -> None:
    """The curve's fits (printed where any run was probed 3 times or more), the curve as a PNG (`--plot`) and the
    rows in MLflow (`--mlflow`)."""
    from jf_core.evaluation.growth import curve_fits, fits_table

    fits = curve_fits(rows)
    if fits:
        print("\nTPF against training tokens, fitted (jf_core/evaluation/growth.py):\n" + fits_table(fits))
    if plot is not None:
        from jf_core.evaluation.plots import tpf_against_tokens

        fig = tpf_against_tokens([r for r in rows if r["train_tokens"]])
        if fig is None:
            print("--plot: no run was probed (set training.tpf_probe_every)", file=sys.stderr)
            plot = None
        else:
            fig.savefig(plot, dpi=120)
    if mlflow:
        from jacobi_forcing.tasks.experiment_runs import log_experiment

        ids = log_experiment(profile, rows, plot, source)
        print(f"logged {len(ids)} runs to MLflow: {', '.join(ids)}")


def register(sub) -> None:
    p = sub.add_parser(
        "experiment", help="variants of a round's data and training, TPF on trained and held-out questions"
    )
    add_profile_options(p)
    p.add_argument("--model", help="directory, hub id, models:/, package: or a .gguf file (default: the profile's)")
    p.add_argument("--train", type=positive("--train"), default=8, help="questions trained on (the train split)")
    p.add_argument("--held-out", type=positive("--held-out"), default=8, help="questions never trained on")
    p.add_argument("--held-out-field", help="the held-out file's text field, where not prompts.text_field")
    p.add_argument("--measure-trained", type=positive("--measure-trained"), help="TPF on the first N trained")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=96, help="tokens per answer")
    p.add_argument("--more-block-sizes", type=int, nargs="+", default=[], help="plain Jacobi at these too")
    p.add_argument("--multiblock", action="store_true", help="multi-block decoding (K = 2) measured at n too")
    p.add_argument(
        "--layout",
        type=named_overrides("--layout"),
        action="append",
        default=[],
        metavar="NAME:JSON",
        help="TPF in this decode layout too (JFDecodeConfig fields, e.g. a tune's winner; repeatable)",
    )
    p.add_argument("--batch-size", type=positive("--batch-size"), default=4, help="decode batch")
    p.add_argument("--collect-batch-size", type=positive("--collect-batch-size"), help="default: --batch-size")
    p.add_argument("--device", default="cpu", help="where every model decodes and trains (cpu, cuda)")
    p.add_argument("--random-weights", action="store_true", help="the model's shape, random weights: a rehearsal")
    p.add_argument(
        "--variant",
        type=named_overrides("--variant"),
        action="append",
        metavar="NAME:JSON",
        help="a variant: its overrides by section, or training's fields alone (repeatable)",
    )
    p.add_argument("--seeds", type=seed_list, help="comma-separated: each variant once per seed (training.seed)")
    p.add_argument("--threads", type=positive("--threads"), default=2, help="torch threads (1 beside other work)")
    p.add_argument("--out", help="JSON lines, one row per model")
    p.add_argument("--plot", type=Path, help="a PNG of TPF against training tokens (needs training.tpf_probe_every)")
    p.add_argument("--mlflow", action="store_true", help="log every row to the profile's MLflow store")
    p.add_argument("--from-json", type=Path, nargs="+", help="no run: read the rows of earlier --out files")
    p.set_defaults(func=cmd_experiment)
