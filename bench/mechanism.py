"""The mechanism check on a real model, and any experiment of the same shape (jf_core/experiment.py): variants of a
round's data and training from one model, each trained through the round's own stages, reported as TPF on the
trained questions and on held-out ones beside the text's identity with the base model and its repetition.

    .venv/bin/python bench/mechanism.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl --train 8 --held-out 8 --max-new-tokens 96 \
        --variant 'fixed:{}' \
        --variant 'each_visit:{"state_pick": "each_visit"}' \
        --variant 'synthetic:{"trajectory": {"kind": "synthetic"}, "training": {"state_pick": "each_visit"}}' \
        --out mechanism.json

Each `--variant NAME:JSON` is a set of overrides on top of the profile (and `--set`): `{"training": {...},
"trajectory": {...}}`, or training's fields alone (`{"lr": 1e-3}`); `"from": "NAME"` starts it from an earlier
variant's trained model (the seed's progressive rounds: round 2 collects its trajectories with round 1's model, an
adapter drafting, and trains on from it). Every variant is a round's stages in its own
directory under the profile's runs directory (`storage.runs_dir`, default `$JF_HOME/runs`), its trajectories shared
with every variant of the same trajectory settings, so the same command run again reads back what is done and goes
on where it died (a training that died resumes from its last checkpoint, `training.checkpoint_every`); each row
names its trained model's directory. Rows go to `--out` as they finish (JSON lines, with each variant's training
history), so a long run can be read while it goes. Trajectories are collected in this process, one model (no Ray);
threads: `--threads` (default 2; run it alone, or with 1 beside other work).

The same round at a GPU's budget (no network there: the model comes as a copied .gguf file, imported next to it
on first use; the prompt file as a copied path), every GSM8K train-split question (1,055), TPF measured on 64 of
them and on 64 held-out ones:

    python bench/mechanism.py --device cuda --model smollm2.gguf --set prompts.source=gsm8k_test.jsonl \
        --set model.dtype=bfloat16 --set trajectory.kind=synthetic --set training.checkpoint_every=100000 \
        --set training.tpf_probe_every=88 --set training.tpf_probe_prompts=32 --set training.tpf_probe_tokens=256 \
        --set 'training.tpf_probe_block_sizes=[32]' --train 100000 --measure-trained 64 --held-out 64 \
        --max-new-tokens 256 --batch-size 64 --collect-batch-size 128 --threads 8 --plot curve.png \
        --variant 'each_visit:{"mask": "clean_context", "state_pick": "each_visit", "batch_size": 32,
                   "grad_accum": 1, "steps": 700, "lr": 1e-4, "warmup_steps": 50}' --out gpu_round.json

(700 steps x 32 packed sequences of about 485 tokens: 1.09 x 10^7 training tokens, TPF at n = 16 and 32 probed 8
times on 32 calibration questions; the run measured below probed n = 16 only, before the probe took more sizes.)
Measured on an H200 on 2026-11-27 (docs/experiments/mechanism.md, has the table and the curve): the whole
command took 7.7 minutes; the synthetic trajectories of 1,055 questions 65 s (3,080 tokens/s), training 294 s (0.35
s a step with the probes, beside the GPU check on the same GPU; 0.24 s a step in the first lease's run).
`--random-weights` runs the same shapes on random weights (the config and tokenizer suffice), which is how the first
run was sized before the weights were on the machine, and how the CUDA path was checked first.

The lent GPU machines' image (2026-11: Python 3.12, torch 2.11, transformers 5.17) lacks pydantic and gguf: carry
their wheels (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, gguf: `pip download
--only-binary=:all: --python-version 3.12 ... -d .whl`, installed there with `--no-index --target`); the 98 MB GGUF
goes over in two parts (the device tool's README). Don't let the profile's `checkpoint_every: 25` stand there: each
checkpoint is 1.6 GB of weights and AdamW state.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

from jf_cli.common import named_overrides
from jf_core.config import load_profile, parse_overrides
from jf_core.experiment import VARIANT_KEYS, ExperimentRow, Measure, Questions, run_experiment, table
from jf_core.model_ref import resolve_model
from jf_core.models import load_model
from jf_core.round.collection import collect_in_process
from jf_core.trajectory.prompts import held_out_source, load_prompts


def _scoring(profile, tokenizer, train, held):
    """References and a scorer for the questions' answers, where the profile's benchmark scores the prompt file's
    own rows (GSM8K: the final number of `answer`): ((trained rows, held-out rows), scorer), accuracy beside TPF;
    ((None, None), None) otherwise."""
    from jf_core.evaluation.benchmarks import BenchmarkItem, score
    from jf_core.trajectory.prompts import rows_by_prompt_id

    benchmark = profile.evaluation.benchmark
    if benchmark not in ("gsm8k", "math", "embedded"):
        return (None, None), None
    train_rows = rows_by_prompt_id(profile.prompts.model_copy(update={"split": "train", "limit": None}))
    e = profile.evaluation
    held_source = held_out_source(profile.prompts, e.source, e.split)
    held_rows = rows_by_prompt_id(held_source.model_copy(update={"limit": None}))
    trained = [train_rows[p.prompt_id] for p in train]
    # A question written by `prompts.number_variants` has no reference answer: the trained set is then not scored.
    references = (None if any("variant_of" in r for r in trained) else trained, [held_rows[p.prompt_id] for p in held])
    if benchmark == "embedded":  # the task's rows are prompts: their answers are worked out
        from jf_core.toy.task import example_of

        references = tuple(
            None if rows is None else [{"answer": example_of(r["prompt"]).answer} for r in rows] for rows in references
        )
    else:
        # A file without answers (chat or code prompts measured for TPF under a GSM8K profile) goes unscored, said
        # here, before hours of decoding, not as a KeyError in the scorer after them.
        sources = (profile.prompts.source, held_source.source)
        references = tuple(
            None if rows is None else _with_references(rows, benchmark, source)
            for rows, source in zip(references, sources, strict=True)
        )

    def correct(tokens: list[int], row: dict) -> bool:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return score(benchmark, BenchmarkItem(uid="", prompt="", record=row), text)

    return references, correct


def _with_references(rows: list[dict], benchmark: str, source: str) -> list[dict] | None:
    """`rows`, or None (unscored, said on stderr) when one lacks the field the benchmark scores against."""
    fields = ("answer", "solution") if benchmark == "math" else ("answer",)
    lacking = sum(not any(f in r for f in fields) for r in rows)
    if not lacking:
        return rows
    print(
        f"{source}: {lacking} of {len(rows)} questions lack a reference `{' or '.join(fields)}` for {benchmark}: "
        "those questions' accuracy is not scored",
        file=sys.stderr,
    )
    return None


def _model_dir(model: str | None, profile) -> str:
    """A .gguf file is imported once, next to itself (`<file>.jf-fp32/`), so a copied file is all a machine needs."""
    if model is None:
        return resolve_model(profile.model.path)
    path = Path(model)
    if path.suffix != ".gguf":
        return model
    out = path.with_name(path.name + ".jf-fp32")
    if not (out / "config.json").is_file():
        from jf_core.model_import import import_gguf

        import_gguf(path, out)
    return str(out)


def _random_weights(model_dir: str) -> str:
    """The model's shape and tokenizer with seeded random weights, in a directory beside it: the whole round at
    its real shapes (collection, FlexAttention training, decoding) timed before the weights are on the machine.
    `model_dir` needs only its config and tokenizer files. Its text means nothing: only shapes and seconds do."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from jf_core.model_dir import save_model_dir

    out = Path(model_dir).with_name(Path(model_dir).name + ".random")
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        save_model_dir(model, out, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    return str(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--model", help="a model directory or a .gguf file (default: the profile's model)")
    ap.add_argument("--train", type=int, default=8, help="questions trained on (the prompts' train split)")
    ap.add_argument("--held-out", type=int, default=8, help="questions never trained on (the test split)")
    ap.add_argument(
        "--held-out-field",
        help="the held-out file's text field, where it is not prompts.text_field (HumanEval's: prompt): questions of "
        "another kind than the trained ones",
    )
    ap.add_argument("--measure-trained", type=int, help="TPF on the first N trained questions (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--more-block-sizes", type=int, nargs="+", default=[], help="plain Jacobi measured at these too (e.g. 32)"
    )
    ap.add_argument(
        "--multiblock", action="store_true", help="multi-block decoding (K = 2, no recycling) measured at n too"
    )
    ap.add_argument("--batch-size", type=int, default=4, help="decode batch (TPF is per sequence)")
    ap.add_argument("--collect-batch-size", type=int, help="trajectory batch (default: --batch-size)")
    ap.add_argument("--device", default="cpu", help="where every model decodes and trains (cpu, cuda)")
    ap.add_argument(
        "--random-weights",
        action="store_true",
        help="the model's shape with random weights: a timing rehearsal (--model may hold no weights)",
    )
    ap.add_argument("--variant", type=named_overrides("--variant"), action="append", metavar="NAME:JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON lines, one row per model")
    ap.add_argument("--plot", type=Path, help="a PNG of TPF against training tokens (needs training.tpf_probe_every)")
    ap.add_argument(
        "--mlflow",
        action="store_true",
        help="log every row to the profile's MLflow store (with --from-json: rows a run wrote elsewhere, a GPU's)",
    )
    ap.add_argument(
        "--from-json", type=Path, nargs="+", help="no run: read the rows of earlier --out files (for --mlflow, --plot)"
    )
    args = ap.parse_args()
    if args.from_json is None and not (args.variant and args.out):
        ap.error("--variant and --out are required (or --from-json FILE to plot or log an earlier run's rows)")
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    if args.from_json is not None:
        rows = [json.loads(line) for f in args.from_json for line in f.read_text().splitlines() if line.strip()]
        _publish(profile, rows, args.plot, args.mlflow, " ".join(map(str, args.from_json)))
        return 0
    model_dir = _model_dir(args.model, profile)
    if args.random_weights:
        model_dir = _random_weights(model_dir)
    profile = experiment_profile(profile, args)
    _, tok = load_model(model_dir, dtype="float32")
    train = load_prompts(profile.prompts, tok).items
    e = profile.evaluation
    field = {"text_field": args.held_out_field} if args.held_out_field else {}
    held_prompts = held_out_source(profile.prompts, e.source, e.split).model_copy(
        update={"limit": args.held_out, **field}
    )
    held = load_prompts(held_prompts, tok).items
    (train_refs, held_refs), score = _scoring(profile, tok, train, held)
    sample = slice(0, args.measure_trained)
    measure = Measure(
        trained=Questions([p.token_ids for p in train[sample]], None if train_refs is None else train_refs[sample]),
        held_out=Questions([p.token_ids for p in held], held_refs),
        block_size=profile.trajectory.block_size,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        draft_init=profile.trajectory.draft_init,
        score=score,
        more_block_sizes=tuple(args.more_block_sizes),
        multiblock=args.multiblock,
    )
    out = Path(args.out)
    out.write_text("")

    def on_row(row: ExperimentRow) -> None:
        with out.open("a") as f:
            f.write(json.dumps(row.summary()) + "\n")
        print(table([row]).splitlines()[-1], flush=True)

    print(table([]), flush=True)
    collect = partial(collect_in_process, say=lambda line: print(line, flush=True))
    variants = {name: sectioned(overrides) for name, overrides in args.variant}
    rows = run_experiment(profile, model_dir, variants, measure, collect=collect, on_row=on_row, progress=True)
    print("\n" + table(rows))
    _publish(profile, [r.summary() for r in rows], args.plot, args.mlflow, " ".join(sys.argv[1:]))
    return 0


def experiment_profile(profile, args):
    """The profile the command's flags describe: the trained questions are the prompt file's train split (`--train`
    of them), their trajectories run to `--max-new-tokens` in batches of `--collect-batch-size` (a shard each, so
    the batch is whole), and every model decodes and trains on `--device` with `--threads`."""
    collect = args.collect_batch_size or args.batch_size
    updates = {
        "prompts": {"split": "train", "limit": args.train},
        "trajectory": {"max_new_tokens": args.max_new_tokens, "batch_size": collect, "shard_size": collect},
        "model": {"device": args.device},
        "compute": {"threads": args.threads},
    }
    return profile.model_copy(
        update={section: getattr(profile, section).model_copy(update=fields) for section, fields in updates.items()}
    )


def sectioned(overrides: dict) -> dict:
    """A variant's overrides by section (and `from`): training's fields alone are the shorthand (`{"lr": 1e-3}`)."""
    return overrides if overrides and set(overrides) <= set(VARIANT_KEYS) else {"training": overrides}


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


if __name__ == "__main__":
    sys.exit(main())
