"""`jf`: the command line over jf_core (and, for orchestration commands, over tasks/ and flows/).

jf bootstrap                                   train the embedded default model from scratch (it ships)
jf models import SOURCE --out DIR              GGUF weights (a file or an installed package) -> a model directory
jf decode --prompt TEXT [--model PATH_OR_ID] [--block-size N]
jf bench forward [--model M] [--widths 1 16 32 64]   the cost of a window at each width (break-even TPF)
jf bench cycle [--model M] [--config N:{...}]     what one decoding cycle costs, part by part, in AR steps
jf bench decode [--profile P] [--jf-model DIR] [--num-prompts N] [--batch-size B] [--out DIR]
jf bench spec --source spec_bench.jsonl [--profile P] [--jf-model M]   Spec-Bench per group, batch 1
jf eval [--profile P] [--benchmark NAME --source PATH_OR_ID] [--model M]   accuracy with TPF and TPS
jf tune --model DIR [--profile P]              autotune the decode config on calibration prompts
jf run [--profile tiny] [--set section.key=value]    one jf-round flow run (the main job)
jf ablate [--profile tiny] [--variant NAME] [--seeds 0,1,2]   variants at equal compute (jf-ablate), a table
jf experiment --variant NAME:JSON --out FILE [--seeds 0,1]  variants' TPF on trained and held-out questions
jf plan [--profile P] [--set section.key=value]      per-GPU memory of the profile's stages, before any work
jf prompts prepare --source DATA --out DIR [--profile P]  a prompt store: filtered, deduplicated, calibration split
jf prompts add FILE [--profile P]               store new prompts; the event starts a retraining round
jf stack up|down|status                        local Prefect + MLflow servers and a worker
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from jf_cli.common import UsageError, model_and_tokenizer, positive


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from jf_core.toy.bootstrap import REPORT, BootstrapConfig, BootstrapReport, bootstrap, embedded_model_dir, exclusive

    cfg = BootstrapConfig(threads=args.threads)
    out = embedded_model_dir(cfg)
    with exclusive(out, say=print):  # a process bootstrapping the same model: wait for it, then reuse its model
        if (out / REPORT).is_file() and not args.force:
            report = BootstrapReport.read(out)
            print(f"embedded model cached at {out}")
        else:
            report = bootstrap(cfg, out)
            print(f"embedded model trained and saved to {out}")
    print(
        f"accuracy {report.accuracy:.4f} on {report.test_size} test items (greedy, exact match); "
        f"{report.parameters / 1e6:.2f}M parameters; bootstrap {report.total_seconds:.0f} s"
    )
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from jf_core.decoding import decode, load_serving_spec, prior
    from jf_core.models import stop_tokens

    if not args.prompt.strip():
        raise UsageError("--prompt is empty")
    model, tokenizer = model_and_tokenizer(args.model)
    spec = load_serving_spec(
        model.name_or_path, block_size=args.block_size, max_new_tokens=args.max_new_tokens, draft_init=args.draft_init
    )
    cfg = spec.decode
    text = args.prompt
    if args.chat:  # the prompt as the user's message in the model's chat template, as /v1/chat/completions renders it
        from jf_core.trajectory.prompts import PromptSourceError, format_prompt

        if not getattr(tokenizer, "chat_template", None):
            raise UsageError(f"--chat: the tokenizer of {model.name_or_path} has no chat template")
        try:
            text = format_prompt(args.prompt, tokenizer, chat_template=True)
        except PromptSourceError as err:
            raise UsageError(f"--chat: {err}") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UsageError("--prompt encodes to no tokens")
    from jf_core.decoding import Sampling

    try:
        sampling = Sampling.of(args.temperature, args.top_k, args.top_p)
    except ValueError as err:
        raise UsageError(f"--{err}") from None
    # The model's own dispatch: where its stored crossover measured AR faster at batch 1, AR (the same text). An
    # explicit --block-size asks for Jacobi at that n.
    method = prior(1, None if args.block_size else spec.ar_above_batch)
    stop = stop_tokens(model, tokenizer)
    out = decode(model, [ids], cfg, sampling=sampling, seeds=[args.seed], stop=stop, decoder=method)
    print(tokenizer.decode(out.sequences[0], skip_special_tokens=True))
    s = out.stats
    how = f"n={cfg.block_size}" if method == "jacobi" else "AR: the model's crossover at batch 1"
    print(f"[{how}] {s.new_tokens} tokens in {s.forwards} forwards: TPF {s.tpf:.2f}, TPS {s.tps:.1f}", file=sys.stderr)
    return 0


class HelpFormatter(argparse.HelpFormatter):
    """Each option's default at the end of its help, unless the help already says it or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default == argparse.SUPPRESS  # not `in`: 0 == False
        if "default" in text or nothing or not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"  # argparse %-formats help strings


def parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and every subcommand's, depth first, each with its command line (`jf bench decode`)."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jf", description="Jacobi Forcing: train a causal LM into its own parallel decoder."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bootstrap", help="train the embedded default model from scratch (the package ships one)")
    p.add_argument("--force", action="store_true", help="retrain even when cached")
    p.add_argument(
        "--threads",
        type=positive("--threads"),
        help="torch CPU threads, kept for the whole training (default: every CPU this process may use); the count is "
        "part of the cached model's key, since 1 and 2 threads train models that differ in their last bits",
    )
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("decode", help="Jacobi-decode one prompt and print the text and TPF")
    p.add_argument("--model", help="local directory, hub id or models:/<name>@<alias> (default: the embedded model)")
    p.add_argument("--prompt", required=True, help="the text to continue (with --chat: the user's message)")
    p.add_argument("--chat", action="store_true", help="send --prompt as a user message in the model's chat template")
    p.add_argument("--block-size", type=positive("--block-size"), help="default: the model's decode config")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=256, help="tokens to generate")
    p.add_argument(
        "--draft-init",
        choices=["prompt_sample", "repeat_last", "random_vocab"],
        help="how a block's first draft is filled (default: the model's decode config)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: exact sampling")
    p.add_argument("--top-k", type=int, default=0, help="with --temperature: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling")
    p.add_argument("--seed", type=int, default=0, help="with --temperature: the sample's noise (same seed, same text)")
    p.set_defaults(func=cmd_decode)

    bench_p = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench_p.add_subparsers(dest="bench", required=True)
    from jf_cli import trajectories

    trajectories.register(sub)
    trajectories.register_bench(bench_sub)

    from jf_cli import evaluate, orchestrate

    orchestrate.register(sub)
    evaluate.register(sub, bench_sub)
    from jf_cli import ablate, experiment, forward, models, plan, prompts, serve

    forward.register_bench(bench_sub)
    models.register(sub)
    ablate.register(sub)
    experiment.register(sub)
    plan.register(sub)
    prompts.register(sub)
    serve.register(sub)
    serve.register_bench(bench_sub)
    from jf_cli import cycle, spec_bench, vllm

    cycle.register_bench(bench_sub)
    spec_bench.register_bench(bench_sub)
    vllm.register_bench(bench_sub)
    for _, each in parsers(parser):
        each.formatter_class = HelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    from jf_core.onednn import size_primitive_cache
    from jf_core.threads import cap_default_threads

    cap_default_threads()  # before torch's first import, here or in a process this one starts
    size_primitive_cache()  # before the first bf16 product, here or in a process this one starts
    from jf_core.models import ModelLoadError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ModelLoadError, ValueError) as err:
        parser.exit(2, f"jf: error: {err}\n")
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM where a command turns it into one: cleaned up by now
        parser.exit(130, f"jf: interrupted{f' ({err})' if str(err) else ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
