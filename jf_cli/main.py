"""`jf`: the command line over jf_core (and, for orchestration commands, over tasks/ and flows/).

jf bootstrap                                   train and cache the embedded default model
jf decode --prompt TEXT [--model PATH_OR_ID] [--block-size N]
jf bench decode [--json PATH] [--num-prompts N] [--batch-size B] [--repeats R]
jf eval --benchmark NAME [--source PATH_OR_ID] [--model M]   accuracy with TPF and TPS
jf run [--profile tiny] [--set section.key=value]    one jf-round flow run (the main job)
jf stack up|down|status                        local Prefect + MLflow servers and a worker
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class UsageError(ValueError):
    """A bad command-line value: printed as `jf: error: ...` with exit status 2, no traceback."""


def _model_and_tokenizer(model: str | None):
    from jf_core.models import load_model
    from jf_core.toy.bootstrap import ensure_embedded_model

    return load_model(str(ensure_embedded_model()) if model is None else model)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from jf_core.toy.bootstrap import BootstrapConfig, bootstrap, embedded_model_dir

    cfg = BootstrapConfig()
    out = embedded_model_dir(cfg)
    if (out / "bootstrap.json").is_file() and not args.force:
        report = json.loads((out / "bootstrap.json").read_text())
        print(f"embedded model cached at {out}")
    else:
        report = bootstrap(cfg, out)
        print(f"embedded model trained and saved to {out}")
    print(
        f"accuracy {report['accuracy']:.4f} on {report['test_size']} test items (greedy, exact match); "
        f"{report['parameters'] / 1e6:.2f}M parameters; bootstrap {report['total_seconds']:.0f} s"
    )
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from jf_core.decoding.config_io import decode, load_decode_config

    if not args.prompt.strip():
        raise UsageError("--prompt is empty")
    cfg = load_decode_config(
        args.model, block_size=args.block_size, max_new_tokens=args.max_new_tokens, draft_init=args.draft_init
    )
    model, tokenizer = _model_and_tokenizer(args.model)
    ids = tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UsageError("--prompt encodes to no tokens")
    out = decode(model, [ids], cfg, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    print(tokenizer.decode(out.sequences[0], skip_special_tokens=True))
    s = out.stats
    print(
        f"[n={cfg.block_size}] {s.new_tokens} tokens in {s.forwards} forwards: TPF {s.tpf:.2f}, TPS {s.tps:.1f}",
        file=sys.stderr,
    )
    return 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    import torch

    from jf_core.evaluation.speed import bench, format_table, standard_methods, write_json
    from jf_core.toy.task import make_split, score

    set_threads(args)
    model, tokenizer = _model_and_tokenizer(args.model)
    examples = make_split("test", args.num_prompts)
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    methods = standard_methods(
        model,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=args.max_new_tokens,
        block_sizes=args.block_sizes,
    )

    same_output_as: dict[str, str] = {}
    if args.jf_model:
        from jf_core.decoding.config_io import load_decode_config
        from jf_core.decoding.multiblock import JFDecodeConfig
        from jf_core.evaluation.speed import jf_methods
        from jf_core.models import load_model

        jf_model, _ = load_model(args.jf_model)
        saved = load_decode_config(args.jf_model)
        extra, same_output_as = jf_methods(
            jf_model,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_new_tokens=args.max_new_tokens,
            block_size=args.jf_block_size or saved.block_size,
            tuned=saved if isinstance(saved, JFDecodeConfig) else None,
        )
        methods.update(extra)

    def scorer(i: int, seq: list[int]) -> bool:
        return score(tokenizer.decode(seq, skip_special_tokens=True), examples[i])

    results = bench(
        methods,
        prompts,
        batch_size=args.batch_size,
        repeats=args.repeats,
        scorer=scorer,
        progress=lambda m: print(f"  {m}", file=sys.stderr),
        same_output_as=same_output_as,
    )
    print(format_table(results))
    if args.out:
        from jf_core.evaluation.speed import format_markdown, save_plots

        out = Path(args.out)
        save_plots(results, out)
        (out / "bench.md").write_text(format_markdown(results) + "\n")
        args.json = args.json or str(out / "bench.json")
        print(f"wrote {out}/bench.md, bench.json and plots", file=sys.stderr)
    if args.json:
        meta = {
            "model": args.model or "embedded-default",
            "num_prompts": len(prompts),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens,
            "device": str(model.device),
            "dtype": str(model.dtype),
            "torch_threads": torch.get_num_threads(),
            "attn_implementation": model.config._attn_implementation,
            "jf_model": args.jf_model,
        }
        write_json(results, Path(args.json), meta)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=_positive("--threads"),
        help="torch intra-op threads for every method (default: torch's); small CPU models often run faster on 1",
    )


def set_threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jf", description="Jacobi Forcing: train a causal LM into its own parallel decoder."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bootstrap", help="train and cache the embedded default model")
    p.add_argument("--force", action="store_true", help="retrain even when cached")
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("decode", help="Jacobi-decode one prompt and print the text and TPF")
    p.add_argument("--model", help="local directory or hub id (default: the embedded model)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--block-size", type=_positive("--block-size"), help="default: the model's decode config")
    p.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=256)
    p.add_argument("--draft-init", choices=["prompt_sample", "repeat_last", "random_vocab"])
    p.set_defaults(func=cmd_decode)

    bench_p = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench_p.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("decode", help="decoding speed of every method on the same prompts, in one run")
    p.add_argument("--model", help="local directory or hub id (default: the embedded model)")
    p.add_argument("--num-prompts", type=_positive("--num-prompts"), default=50)
    p.add_argument("--batch-size", type=_positive("--batch-size"), default=1)
    p.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=160)
    p.add_argument("--block-sizes", type=_positive("--block-sizes"), nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--jf-model", help="a Jacobi Forcing model: adds its vanilla, recycling, multi-block and tuned rows")
    p.add_argument("--jf-block-size", type=_positive("--jf-block-size"), help="default: its decode config's n")
    p.add_argument("--out", help="directory for bench.json, bench.md and the plots")
    p.add_argument("--repeats", type=_positive("--repeats"), default=3, help="runs per method, fastest kept")
    add_threads_option(p)
    p.set_defaults(func=cmd_bench_decode)

    from jf_cli import trajectories

    trajectories.register(sub)
    trajectories.register_bench(bench_sub)

    from jf_cli import rounds

    rounds.register(sub)

    from jf_cli import evaluate, orchestrate

    orchestrate.register(sub)
    evaluate.register(sub)
    evaluate.register_tune(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from jf_core.models import ModelLoadError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ModelLoadError, ValueError) as err:
        parser.exit(2, f"jf: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
