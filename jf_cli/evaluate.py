"""`jf eval`, `jf bench decode` and `jf tune`: a model evaluated, benchmarked and tuned the way a round does it
(jf_core/evaluation/evaluate.py), on the prompts of a profile: its benchmark for accuracy and speed, its prompt
source for calibration, its prompt format (chat template, system prompt) for both. The toy task is only the
embedded model's (the `tiny` profile's); `--profile qwen2.5-coder-7b --model Qwen/...` evaluates on HumanEval.

jf eval [--profile P] [--model M] [--benchmark B --source S] [--set evaluation.key=value]
jf bench decode [--profile P] [--model M] [--jf-model DIR] [--num-prompts N] [--batch-size B] [--out DIR]
jf tune --model DIR [--profile P] [--block-sizes ...]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from jf_cli.common import (
    UsageError,
    add_profile_options,
    add_threads_option,
    args_profile,
    model_path,
    positive,
    set_threads,
)

if TYPE_CHECKING:
    from jf_core.evaluation.method import Method
    from jf_core.evaluation.results import Evaluation


def _say(message: str) -> None:
    print(f"  {message}", file=sys.stderr)


def _load(profile, model: str | None):
    from jf_core.models import load_model

    path = model_path(model, profile)
    loaded, tok = load_model(path, **profile.model.decode_kwargs())
    return path, loaded, tok


def _report(result: Evaluation, args: argparse.Namespace, meta: dict, trained: Method | None = None) -> list:
    """Print the table and the headline; with `--out`, write bench.md, bench.json and the table's figures. Returns
    the table's rows. `trained`: the row of a trained model beside this (untrained) one, held to the fastest of
    this model's untrained decoders (HF prompt lookup, our tuned decoder); else the round's anchors, if any ran."""
    from jf_core.evaluation.method import HF_PROMPT_LOOKUP, TUNED
    from jf_core.evaluation.plots import bench_figures, save_figures
    from jf_core.evaluation.results import adapter_part
    from jf_core.evaluation.tables import format_markdown, format_table, write_json

    rows = result.rows()
    print(format_table(rows))
    print(
        f"\n{result.benchmark}: accuracy {result.accuracy:.3f} on {result.items} items ({result.dtype}); "
        f"headline {result.headline_method}: TPF {result.headline.tpf:.2f}, "
        f"{result.headline.speedup_vs_ar:.2f}x our AR on the same model"
        + (f" (n={result.speedup_block_size} chosen on calibration prompts)" if result.calibration.tps else "")
    )
    # A trained model beside this one is held to this model's untrained decoders; else the round's anchors.
    versus = result.versus(trained, [HF_PROMPT_LOOKUP, TUNED]) if trained is not None else result.versus()
    best, x = versus.best, versus.speedup
    print(f"{trained or result.headline_method}: " + versus.line(result.timing_spread))
    print(adapter_part(result.speedup_vs_no_adapter, result.adapter_left_out), end="")
    result_fields = result.model_dump(mode="json", exclude={"methods"})
    meta = {**meta, "speedup_vs_untrained": x, "best_untrained": best and best.name, "result": result_fields}
    if getattr(args, "out", None):
        out = Path(args.out)
        save_figures(bench_figures(rows), out)
        (out / "bench.md").write_text(format_markdown(rows) + "\n")
        args.json = args.json or str(out / "bench.json")
        print(f"wrote {out}/bench.md, bench.json and plots", file=sys.stderr)
    if args.json:
        write_json(rows, Path(args.json), meta)
        print(f"wrote {args.json}", file=sys.stderr)
    return rows


def cmd_eval(args: argparse.Namespace) -> int:
    from jf_core.evaluation.benchmarks import load_benchmark
    from jf_core.round.stages import stage_evaluate, stage_tune_untrained, untrained_anchors

    limit = args.limit
    profile = args_profile(
        args,
        evaluation={
            "benchmark": args.benchmark,
            "source": args.source,
            "template": args.template,
            "num_prompts": limit,
            "speed_prompts": min(limit, 30) if limit else None,
            "block_sizes": args.block_sizes,
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
        },
    )
    e = profile.evaluation
    load_benchmark(e.benchmark, e.source, limit=1, template=e.template)  # a bad benchmark file, before any model
    model = model_path(args.model, profile)
    untrained = None
    if args.untrained_from:
        # A trained model held to its input model's untrained decoding, as the round's evaluation holds it: the
        # input model's tune (kept under $JF_HOME, so a round's is reused) and its rows timed beside the model's.
        base = model_path(args.untrained_from, profile)
        untrained = untrained_anchors(profile, base, stage_tune_untrained(profile, base, progress=_say))
    # The round's evaluation stage, measured afresh: a round that meets this model and profile reuses it.
    result = stage_evaluate(profile, model, untrained=untrained, progress=_say, reuse=False)
    _report(result, args, {"model": model, "profile": profile.name})
    return 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from jf_core.evaluation.evaluate import evaluate_profile
    from jf_core.evaluation.methods import build_methods
    from jf_core.models import stop_tokens

    set_threads(args)
    sampling = _sampling(args)  # before anything loads: a bad flag is named at once
    n = args.num_prompts
    profile = args_profile(
        args,
        evaluation={
            "num_prompts": n,
            "speed_prompts": n,
            "batch_size": args.batch_size,
            "speed_batch_size": args.batch_size,
            "block_sizes": args.block_sizes,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "min_timed_seconds": args.min_seconds,
        },
    )
    cfg = profile.evaluation
    path, model, tok = _load(profile, args.model)
    # Beside the rows evaluate_model builds (ours), HF's; then the trained model's: one builder for every row.
    lookup_sizes = cfg.block_sizes if args.lookup else ()
    extra = build_methods(
        model, stop_tokens(model, tok), cfg.max_new_tokens, ar=False, hf=True, lookup_sizes=lookup_sizes
    )
    trained = _trained_rows(args, profile, lookup_sizes, sampling) if args.jf_model else None
    if trained is not None:
        extra.update(trained.rows)
    sizes = args.batch_sizes or [args.batch_size]
    tables: dict[int, list] = {}
    for batch_size in sizes:
        if len(sizes) > 1:
            print(f"\n## batch size {batch_size}\n")
        at = cfg.model_copy(update={"batch_size": batch_size, "speed_batch_size": batch_size})
        # The round's evaluation of this model (its tuned row dispatched as every consumer decodes it), with the
        # rows beside it.
        result = evaluate_profile(
            path,
            profile.model_copy(update={"evaluation": at}),
            loaded=(model, tok),
            extra_methods=extra,
            same_output_as=dict.fromkeys(trained.rows, trained.reference) if trained else None,
            tuning=untrained_tuning(profile, path) if trained else None,
            progress=_say,
        )
        where = argparse.Namespace(**vars(args))  # one table per batch size, each in its own folder
        if len(sizes) > 1:
            where.out = str(Path(args.out) / f"batch{batch_size}") if args.out else None
            where.json = str(Path(args.json).with_suffix(f".batch{batch_size}.json")) if args.json else None
        meta = _bench_meta(args, profile, path, model, batch_size, sampling)
        tables[batch_size] = _report(result, where, meta, trained and trained.headline)
    if args.out and len(sizes) > 1:
        from jf_core.evaluation.plots import save_figures, speed_against_batch_size

        save_figures({"speed_against_batch_size": speed_against_batch_size(tables)}, Path(args.out))
        print(f"wrote {args.out}/speed_against_batch_size.png", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class TrainedRows:
    """A trained model's rows beside the base's in `jf bench decode`: each must reproduce `reference` (its own AR),
    and `headline` (its dispatched decoding) is held to the base's fastest untrained decoder."""

    rows: dict[Method, object]  # each its decoder
    reference: Method
    headline: Method


def _trained_rows(args: argparse.Namespace, profile, lookup_sizes, sampling) -> TrainedRows:
    from jf_core.decoding import load_serving_spec
    from jf_core.evaluation.method import AR, Method, jacobi
    from jf_core.evaluation.methods import build_methods
    from jf_core.models import load_model, stop_tokens

    # One door for every model option: `models:/name@champion`, `package:`, a hub id or a directory.
    args.jf_model = model_path(args.jf_model, profile)
    jf_model, jf_tok = load_model(args.jf_model, **profile.model.decode_kwargs())
    saved = load_serving_spec(args.jf_model)
    jf_n = args.jf_block_size or saved.decode.block_size
    rows = build_methods(
        jf_model,
        stop_tokens(jf_model, jf_tok),
        profile.evaluation.max_new_tokens,
        model_tag="jf",
        block_sizes=sorted({jf_n, *profile.evaluation.block_sizes}),  # beside the base's, for TPF against n
        lookup_sizes=lookup_sizes,
        variants_at=jf_n,
        tuned=saved.tuned,
        tuned_kind="autotuned",
        full_width=True,
        ar_above_batch=saved.ar_above_batch,
        sampling=sampling,
    )
    headline = Method("autotuned", model="jf") if saved.tuned else jacobi(jf_n, "jf")
    return TrainedRows(rows, AR.of("jf"), headline)


def _bench_meta(args: argparse.Namespace, profile, path: str, model, batch_size: int, sampling) -> dict:
    """What `bench.json` says of the run beside its rows."""
    import torch

    from jf_core.decoding.backends import attention_implementation

    return {
        "profile": profile.name,
        "model": path,
        "jf_model": args.jf_model,
        "benchmark": profile.evaluation.benchmark,
        "num_prompts": args.num_prompts,
        "batch_size": batch_size,
        "repeats": args.repeats,
        "min_timed_seconds": profile.evaluation.min_timed_seconds,
        "max_new_tokens": profile.evaluation.max_new_tokens,
        "device": str(model.device),
        "dtype": str(model.dtype),
        "torch_threads": torch.get_num_threads(),
        "attn_implementation": attention_implementation(model),
        "jf_sampling": asdict(sampling) if sampling else None,  # the jf_* rows' (the others are greedy)
    }


def untrained_tuning(profile, path: str):
    """The base model's own tuned config and crossover for its `tuned` row, the untrained anchor a trained model is
    held to: the round's untrained tune (kept under the runs directory, so a base is tuned once) where the base's
    directory stores none and the profile tunes. None: the row is the stored config's, or there is none."""
    from jf_core.decoding import load_serving_spec
    from jf_core.round.stages import stage_tune_untrained

    if load_serving_spec(path).tuned is not None:
        return None
    found = stage_tune_untrained(profile, path, lambda line: _say(f"untrained tune: {line}"))
    if found is None:
        return None
    return found.best, found.serving.ar_above_batch if found.serving is not None else None


def _sampling(args: argparse.Namespace):
    """`--temperature` > 0: the JF model's rows sample (exactly; the base model's rows stay greedy)."""
    if not getattr(args, "temperature", 0):
        return None
    if not args.jf_model:
        raise UsageError("--temperature applies to the --jf-model rows: give --jf-model")
    from jf_core.decoding import Sampling

    try:
        return Sampling.of(args.temperature, args.top_k, args.top_p)
    except ValueError as err:
        raise UsageError(f"--{err}") from None


def grid_item(text: str) -> tuple[str, list]:
    """`--grid block_size=16,32` -> ("block_size", [16, 32]); each value read as YAML reads it (16, 0.85, true)."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=V1,V2 (block_size=16,32)")
    return name.strip(), [yaml.safe_load(v) for v in values.split(",")]


def cmd_tune(args: argparse.Namespace) -> int:
    from jf_core.round.stages import stage_tune

    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model {args.model} is not a model directory (the decode config is saved beside it)")
    set_threads(args)
    given = {
        "prompts": args.num_prompts,
        "repeats": args.repeats,
        "rungs": args.rungs,
        "crossover_batch_sizes": args.crossover_batch_sizes,
    }
    profile = args_profile(args, evaluation={"max_new_tokens": args.max_new_tokens})
    tune = profile.evaluation.tune.model_dump()
    tune |= {k: v for k, v in given.items() if v is not None} | {"enabled": True}
    tune["grid"] = {**tune["grid"], **dict(args.grid or ())}
    profile = args_profile(args, evaluation={"max_new_tokens": args.max_new_tokens, "tune": tune})

    def show(i: int, total: int, t) -> None:
        print(f"  [{i}/{total}] {t.config.describe()}: TPS {t.tps:.1f}, TPF {t.tpf:.2f}", file=sys.stderr)

    # The round's tune stage, run again on this model.
    report = stage_tune(profile, Path(args.model), progress=_say, reuse=False, on_trial=show)
    best, win = report.best, report.best_trial
    path = Path(args.model) / "config.json"
    print(f"best: {best.describe()}: TPS {win.tps:.1f}, TPF {win.tpf:.2f}; saved {path}")
    if (serving := report.serving) is not None:
        pairs = zip(serving.crossover.batch_sizes, serving.crossover.speedup_vs_ar, strict=True)
        print("crossover (Jacobi TPS / AR TPS): " + ", ".join(f"b{b} {x:.2f}x" for b, x in pairs))
        above = serving.ar_above_batch
        print(
            f"AR above batch {above}" if above is not None else "Jacobi paid at every batch size measured",
            f"on {serving.hardware}; stored in {path}",
        )
    return 0


def register(sub, bench_sub) -> None:
    _register_eval(sub)
    _register_bench_decode(bench_sub)
    _register_tune(sub)


def _register_eval(sub) -> None:
    p = sub.add_parser("eval", help="accuracy next to TPF and TPS, every method taking turns, as a round evaluates")
    add_profile_options(p, "benchmark, prompts, prompt format")
    p.add_argument(
        "--model", help="directory, hub id, models:/<name>@<alias> or package:<name> (default: the profile's model)"
    )
    p.add_argument(
        "--benchmark",
        choices=["humaneval", "mbpp", "gsm8k", "math", "embedded"],
        help="scored by execution (humaneval, mbpp) or by answer (default: the profile's)",
    )
    p.add_argument("--source", help="local JSONL/JSONL.gz/Parquet or hub id (default: the benchmark's hub id)")
    p.add_argument("--template", help="prompt template, e.g. 'Question: {question}\\nAnswer:'")
    p.add_argument("--limit", type=positive("--limit"), help="items to evaluate")
    p.add_argument("--block-sizes", type=positive("--block-sizes"), nargs="+", help="Jacobi n (default: the profile's)")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), help="default: the profile's")
    p.add_argument("--batch-size", type=positive("--batch-size"), help="prompts decoded together")
    p.add_argument("--repeats", type=positive("--repeats"), help="timed runs per method, fastest kept")
    p.add_argument("--json", help="also write the per-method results here")
    p.add_argument(
        "--untrained-from",
        metavar="MODEL",
        help="the model this one was trained from: its untrained anchors (HF prompt lookup, our decoder tuned on "
        "it) timed beside this model's rows, as in a round's evaluation",
    )
    p.set_defaults(func=cmd_eval)


def _register_bench_decode(bench_sub) -> None:
    p = bench_sub.add_parser("decode", help="every decoding method on the profile's benchmark prompts, in one run")
    add_profile_options(p, "benchmark, prompts, prompt format")
    p.add_argument(
        "--model", help="directory, hub id, models:/<name>@<alias> or package:<name> (default: the profile's model)"
    )
    p.add_argument("--num-prompts", type=positive("--num-prompts"), default=50, help="benchmark prompts")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=1, help="prompts decoded together")
    p.add_argument(
        "--batch-sizes",
        type=positive("--batch-sizes"),
        nargs="+",
        help="one table per batch size (e.g. 1 4 16 48), each with every method taking turns; --out gets batchB/ "
        "and speed_against_batch_size.png",
    )
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=160, help="tokens per prompt")
    p.add_argument("--block-sizes", type=positive("--block-sizes"), nargs="+", default=[8, 16, 32, 64], help="Jacobi n")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--jf-model", help="a Jacobi Forcing model: adds its vanilla, recycling, multi-block and tuned rows")
    p.add_argument(
        "--lookup",
        action="store_true",
        help="also each block size with prompt lookup's guess verified beside the window (`lookup_n*` rows)",
    )
    p.add_argument("--jf-block-size", type=positive("--jf-block-size"), help="default: its decode config's n")
    p.add_argument(
        "--temperature", type=float, default=0.0, help="> 0: the --jf-model rows sample (TPF under sampling)"
    )
    p.add_argument("--top-k", type=int, default=0, help="with --temperature: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling")
    p.add_argument("--out", help="directory for bench.json, bench.md and the plots")
    p.add_argument("--repeats", type=positive("--repeats"), default=3, help="runs per method, fastest kept")
    p.add_argument(
        "--min-seconds",
        type=float,
        help="more runs until each method has this long timed (default: the profile's evaluation.min_timed_seconds)",
    )
    add_threads_option(p)
    p.set_defaults(func=cmd_bench_decode)


def _register_tune(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="search the decode config grid for the best TPS here; save the model's decode config (the round's tune "
        "stage, on the profile's evaluation.tune unless an option below says otherwise)",
    )
    add_profile_options(p, "benchmark, prompts, prompt format")
    prof = "the profile's evaluation.tune"
    p.add_argument("--model", required=True, help="model directory (the config goes into its config.json)")
    p.add_argument(
        "--num-prompts", type=positive("--num-prompts"), help=f"calibration prompts (default: {prof}.prompts)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive("--max-new-tokens"),
        help=f"tokens per prompt (default: {prof}.max_new_tokens, else the profile's evaluation.max_new_tokens)",
    )
    p.add_argument(
        "--grid",
        action="append",
        type=grid_item,
        metavar="FIELD=V1,V2",
        help=f"values to try for a decode config field, named as JFDecodeConfig names it (block_size=16,32 "
        f"num_blocks=1,2 pool_size=0,4 lookup=0,16 adaptive_width=false,true ...); repeat for each field; "
        f"the others as {prof}.grid says",
    )
    p.add_argument(
        "--repeats", type=positive("--repeats"), help=f"runs per candidate, fastest kept (default: {prof}.repeats)"
    )
    p.add_argument(
        "--rungs",
        type=positive("--rungs"),
        help=f"successive halving: the prompts in this many slices, the slower half of the configs stopping after "
        f"each but the last (1: every config on every prompt; default: {prof}.rungs)",
    )
    p.add_argument(
        "--crossover-batch-sizes",
        type=int,
        nargs="*",
        help="batch sizes where AR and the winner take turns; the crossover goes into the model (the flag alone: "
        f"skip; default: {prof}.crossover_batch_sizes)",
    )
    add_threads_option(p)
    p.set_defaults(func=cmd_tune)
