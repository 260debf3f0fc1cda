"""The mechanism check on a real model (jf_core/round/mechanism.py): train on a few questions' own trajectories,
one variant at a time, and report TPF on those questions and on held-out ones beside the text's identity with the
base model and its repetition.

    .venv/bin/python bench/mechanism.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl --train 8 --held-out 8 --max-new-tokens 96 \
        --variant 'fixed:{}' \
        --variant 'each_visit:{"state_pick": "each_visit"}' \
        --out mechanism.json

Each `--variant NAME:JSON` is a set of `training` overrides on top of the profile (and `--set training.*`). Rows go
to `--out` as they finish (JSON lines, with each variant's training history), so a long run can be read while it
goes. Threads: `--threads` (default 2; run it alone, or with 1 beside other work).

The same round at a GPU's budget (no network there: the model comes as a copied .gguf file, imported next to it
on first use; the prompt file as a copied path), every GSM8K train-split question, 64 held-out ones:

    python bench/mechanism.py --device cuda --model smollm2.gguf --set prompts.source=gsm8k_test.jsonl \
        --set model.dtype=bfloat16 --train 100000 --held-out 64 --max-new-tokens 256 \
        --batch-size 64 --collect-batch-size 64 --set trajectory.kind=synthetic \
        --variant 'each_visit:{"mask": "clean_context", "state_pick": "each_visit", "batch_size": 32, "grad_accum": 1,
                   "steps": 1000, "lr": 1e-4, "warmup_steps": 50}' --out gpu_round.json

(1000 steps x 32 packed sequences of about 650 tokens: 2 x 10^7 training tokens.) The lent GPU machines' image
has torch, transformers and pyarrow but not pydantic or gguf: carry their wheels (`pip download pydantic gguf -d
wheels`, installed there with `--no-index`); the 98 MB GGUF goes over in two parts (the device tool's README).
Rehearsed on this CPU at a tiny size, from a copied GGUF file (2026-11-26: `--device cpu --model /tmp/gguf/
smollm2.gguf --set trajectory.kind=synthetic --train 2 --held-out 2 --max-new-tokens 16 --batch-size 2 --threads 1`
with the variant above at `"batch_size": 2, "steps": 2, "warmup_steps": 0`: imported, collected, trained, measured
in 92 s); not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from jf_cli.common import parse_overrides
from jf_core.config import load_profile
from jf_core.models import load_model
from jf_core.round.mechanism import MechanismRow, run_mechanism, table
from jf_core.trajectory.prompts import load_prompts


def _variant(text: str) -> tuple[str, dict]:
    name, sep, body = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant expects NAME:JSON, got {text!r}")
    try:
        overrides = json.loads(body)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--variant {name}: not JSON ({e})") from None
    if not isinstance(overrides, dict):
        raise argparse.ArgumentTypeError(f"--variant {name}: expected a JSON object of training overrides")
    return name, overrides


def _model_dir(model: str | None, profile, threads: int) -> str:
    """A .gguf file is imported once, next to itself (`<file>.jf-fp32/`), so a copied file is all a machine needs."""
    if model is None:
        return profile.model.resolve(threads)
    path = Path(model)
    if path.suffix != ".gguf":
        return model
    out = path.with_name(path.name + ".jf-fp32")
    if not (out / "config.json").is_file():
        from jf_core.model_import import import_gguf

        import_gguf(path, out)
    return str(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--model", help="a model directory or a .gguf file (default: the profile's model)")
    ap.add_argument("--train", type=int, default=8, help="questions trained on (the prompts' train split)")
    ap.add_argument("--held-out", type=int, default=8, help="questions never trained on (the test split)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=4, help="decode batch (TPF is per sequence)")
    ap.add_argument("--collect-batch-size", type=int, help="trajectory batch (default: --batch-size)")
    ap.add_argument("--device", default="cpu", help="where every model decodes and trains (cpu, cuda)")
    ap.add_argument("--variant", type=_variant, action="append", required=True, metavar="NAME:JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="JSON lines, one row per model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    model_dir = _model_dir(args.model, profile, args.threads)
    _, tok = load_model(model_dir, dtype="float32")
    held_split = profile.evaluation.split or "test"
    train = load_prompts(profile.prompts.model_copy(update={"split": "train", "limit": args.train}), tok).items
    held = load_prompts(profile.prompts.model_copy(update={"split": held_split, "limit": args.held_out}), tok).items
    out = Path(args.out)
    out.write_text("")

    def on_row(row: MechanismRow) -> None:
        with out.open("a") as f:
            f.write(json.dumps(row.summary()) + "\n")
        print(table([row]).splitlines()[-1], flush=True)

    print(table([]), flush=True)
    rows = run_mechanism(
        profile,
        model_dir,
        dict(args.variant),
        train=[p.token_ids for p in train],
        held_out=[p.token_ids for p in held],
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        collect_batch_size=args.collect_batch_size,
        device=args.device,
        on_row=on_row,
        progress=True,
    )
    print("\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
