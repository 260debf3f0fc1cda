"""`jf bench spec`: Spec-Bench per group at batch 1 (jf_core/evaluation/spec_bench.py): our AR, its control, HF's prompt
lookup, our decoder untrained (the profile's tune run on the base, kept under the runs directory), and with
`--jf-model` the trained model's dispatched decoding, every method taking turns on the same prompts, every output
checked against the base's greedy AR.

    jf bench spec --profile smollm2-135m --source ../shared/benchmarks/spec_bench.jsonl --per-group 4 \
        --max-new-tokens 96 --jf-model models:/jf-smollm2-135m@champion --out spec
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jf_cli.common import (
    UsageError,
    add_profile_options,
    add_threads_option,
    args_profile,
    model_path,
    positive,
    set_threads,
)


def cmd_bench_spec(args: argparse.Namespace) -> int:
    import torch

    from jf_core.evaluation import spec_bench
    from jf_core.evaluation.evaluate import with_control
    from jf_core.evaluation.method import AR, HF_PROMPT_LOOKUP
    from jf_core.evaluation.methods import build_methods
    from jf_core.models import load_model, stop_tokens
    from jf_core.trajectory.prompts import PromptFormat

    set_threads(args)
    questions = spec_bench.load_questions(args.source, args.per_group, args.groups or spec_bench.GROUPS)
    profile = args_profile(args, evaluation={"max_new_tokens": args.max_new_tokens})
    new = profile.evaluation.max_new_tokens
    path = model_path(args.model, profile)
    model, tok = load_model(path, **profile.model.decode_kwargs())
    stop = stop_tokens(model, tok)
    tuned = None if args.no_tune else _untrained_tuned(profile, path)
    methods = with_control(
        build_methods(
            model, stop, new, prompt_lookup=True, tuned=tuned, lookup_sizes=[] if tuned else [args.block_size]
        )
    )
    refs = {"model": args.model or profile.model.path, "jf_model": args.jf_model}  # as named, for bench.json
    if args.jf_model:
        methods.update(_trained_rows(args, profile, new))
    ar_answer = methods[AR]
    fmt = PromptFormat.of(profile.prompts)
    prompts = {
        group: spec_bench.turn_prompts(qs, tok, lambda ids: list(ar_answer([ids]).sequences[0]), fmt)
        for group, qs in questions.items()
        if qs
    }
    if not prompts:
        raise UsageError(f"{args.source}: no question of the groups asked ({', '.join(questions)})")
    _say(f"{sum(map(len, prompts.values()))} prompts in {len(prompts)} groups, {len(methods)} methods taking turns")
    results = spec_bench.run_groups(methods, prompts, repeats=args.repeats, progress=_say)
    md = spec_bench.table(results, versus=HF_PROMPT_LOOKUP)
    print(md)
    diverged = {g: [r.method.label for r in rows if r.identical_fraction < 1.0] for g, rows in results.items()}
    if any(diverged.values()):
        print(f"\noutputs that are not greedy AR's: {diverged}", file=sys.stderr)
    if args.out:
        _write(Path(args.out), md, results, args, profile, {**refs, "untrained_tuned": tuned})
    return 1 if any(diverged.values()) and model.dtype == torch.float32 else 0  # fp32: every output is AR's


def _untrained_tuned(profile, path: str):
    from jf_cli.evaluate import untrained_tuning

    found = untrained_tuning(profile, path)
    if found is not None:
        return found[0]
    from jf_core.decoding import load_serving_spec

    return load_serving_spec(path).tuned  # the base's own stored config, or None: no tune (lookup row instead)


def _trained_rows(args: argparse.Namespace, profile, new: int) -> dict:
    """The trained model's dispatched decoding (its tuned config, else plain Jacobi at its block size), held to the
    base's greedy AR: a draft-only adapter's outputs are the base's by construction."""
    from jf_core.decoding import load_serving_spec
    from jf_core.evaluation.methods import build_methods
    from jf_core.models import load_model, stop_tokens

    args.jf_model = model_path(args.jf_model, profile)
    jf_model, jf_tok = load_model(args.jf_model, **profile.model.decode_kwargs())
    saved = load_serving_spec(args.jf_model)
    return build_methods(
        jf_model,
        stop_tokens(jf_model, jf_tok),
        new,
        ar=False,
        model_tag="jf",
        block_sizes=[] if saved.tuned else [saved.decode.block_size],
        tuned=saved.tuned,
        tuned_kind="autotuned",
    )


def _write(out: Path, md: str, results: dict, args: argparse.Namespace, profile, what: dict) -> None:
    from dataclasses import asdict

    import torch

    from jf_core.atomic import write_json_atomic, write_text_atomic

    meta = {
        "profile": profile.name,
        "model": what["model"],
        "jf_model": what["jf_model"],
        "untrained_tuned": asdict(what["untrained_tuned"]) if what["untrained_tuned"] else None,
        "source": args.source,
        "per_group": args.per_group,
        "max_new_tokens": profile.evaluation.max_new_tokens,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
    }
    rows = {
        group: {r.method.label: {k: getattr(r, k) for k in ("tpf", "tps", "speedup_vs_ar", "identical_fraction",
                                                             "new_tokens", "seconds")} for r in rs}
        for group, rs in results.items()
    }  # fmt: skip
    write_text_atomic(out / "spec_bench.md", md + "\n")
    write_json_atomic(out / "spec_bench.json", {"meta": meta, "groups": rows})
    print(f"wrote {out}/spec_bench.md and spec_bench.json", file=sys.stderr)


def _say(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def register_bench(bench_sub) -> None:
    from jf_core.evaluation.spec_bench import GROUPS

    p = bench_sub.add_parser(
        "spec", help="Spec-Bench per group at batch 1: AR, HF prompt lookup, ours untrained/trained"
    )
    add_profile_options(p)
    p.add_argument("--model", help="the base: directory, hub id, models:/, package: (default: the profile's model)")
    p.add_argument("--jf-model", help="a trained model of the same base: its dispatched decoding joins the table")
    p.add_argument("--source", required=True, help="Spec-Bench's question.jsonl")
    p.add_argument("--per-group", type=positive("--per-group"), default=4, help="questions per group (file order)")
    p.add_argument("--groups", nargs="+", choices=GROUPS, help=f"default: all of {', '.join(GROUPS)}")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=96, help="tokens per turn")
    p.add_argument("--repeats", type=positive("--repeats"), default=1, help="timed runs per method, fastest kept")
    p.add_argument(
        "--no-tune",
        action="store_true",
        help="no untrained tune: our untrained decoder is Jacobi with prompt lookup at --block-size",
    )
    p.add_argument("--block-size", type=positive("--block-size"), default=16, help="with --no-tune")
    p.add_argument("--out", help="directory for spec_bench.md and spec_bench.json")
    add_threads_option(p)
    p.set_defaults(func=cmd_bench_spec)
