"""`jf eval --benchmark NAME`: accuracy next to TPF and TPS, decoding with the model's decode config (lossless, so
the accuracy is the model's own greedy accuracy); `jf tune`: find and save that decode config."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from jf_cli.main import _model_and_tokenizer
    from jf_core.decoding.config_io import decode, load_decode_config
    from jf_core.decoding.stats import DecodeStats
    from jf_core.evaluation.benchmarks import load_benchmark, score

    items = load_benchmark(args.benchmark, args.source, limit=args.limit, template=args.template)
    model, tok = _model_and_tokenizer(args.model)
    cfg = load_decode_config(args.model, block_size=args.block_size, max_new_tokens=args.max_new_tokens)
    stats, correct, rows = DecodeStats(sequences=[]), 0, []
    bar = tqdm(range(0, len(items), args.batch_size), desc=f"{args.benchmark} n={cfg.block_size}", unit="batch")
    for start in bar:
        batch = items[start : start + args.batch_size]
        prompts = [tok(i.prompt, add_special_tokens=False)["input_ids"] for i in batch]
        out = decode(model, prompts, cfg, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        stats = stats.merge(out.stats)
        for item, seq in zip(batch, out.sequences, strict=True):
            text = tok.decode(seq, skip_special_tokens=True)
            ok = score(args.benchmark, item, text)
            correct += ok
            rows.append({"uid": item.uid, "correct": ok, "completion": text})
        bar.set_postfix(acc=f"{correct / len(rows):.3f}", tpf=f"{stats.tpf:.2f}")
    result = {
        "benchmark": args.benchmark,
        "items": len(items),
        "accuracy": correct / max(1, len(items)),
        "tpf": stats.tpf,
        "tps": stats.tps,
        "decode_config": asdict(cfg),
    }
    print(
        f"{args.benchmark}: accuracy {result['accuracy']:.3f} on {len(items)} items; "
        f"TPF {stats.tpf:.2f}, TPS {stats.tps:.1f} (n={cfg.block_size}, batch {args.batch_size})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "rows": rows}, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def register(sub) -> None:
    from jf_cli.main import _positive

    p = sub.add_parser("eval", help="accuracy on a benchmark next to TPF and TPS (greedy Jacobi decoding)")
    p.add_argument("--benchmark", required=True, choices=["humaneval", "mbpp", "gsm8k", "math", "embedded"])
    p.add_argument("--source", help="local JSONL/JSONL.gz/Parquet or hub id (default: the benchmark's hub id)")
    p.add_argument("--model", help="local directory or hub id (default: the embedded model)")
    p.add_argument("--template", help="prompt template, e.g. 'Question: {question}\\nAnswer:'")
    p.add_argument("--limit", type=_positive("--limit"))
    p.add_argument("--block-size", type=_positive("--block-size"))
    p.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=512)
    p.add_argument("--batch-size", type=_positive("--batch-size"), default=8)
    p.add_argument("--json", help="also write per-item results here")
    p.set_defaults(func=cmd_eval)


def cmd_tune(args: argparse.Namespace) -> int:
    from jf_core.decoding.config_io import save_decode_config
    from jf_core.evaluation.tune import TuneSpace, tune
    from jf_core.models import load_model
    from jf_core.toy.task import make_split

    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model {args.model} is not a model directory (the decode config is saved beside it)")
    from jf_cli.main import set_threads

    set_threads(args)
    model, tok = load_model(args.model)
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("calib", args.num_prompts)]
    space = TuneSpace(
        block_sizes=tuple(args.block_sizes),
        num_blocks=tuple(args.num_blocks),
        pool_sizes=tuple(args.pool_sizes),
        spawn_ratios=tuple(args.spawn_ratios),
        ngrams=tuple(args.ngrams),
        seed_drafts=tuple(bool(x) for x in args.seed_drafts),
    )

    def show(i: int, total: int, t) -> None:
        c = t.config
        print(
            f"  [{i}/{total}] n={c['block_size']} K={c['num_blocks']} pool={c['pool_size']} "
            f"r={c['spawn_ratio']} ngram={c['ngram']} seeded={c['seed_drafts']}: TPS {t.tps:.1f}, TPF {t.tpf:.2f}",
            file=sys.stderr,
        )

    best, trials = tune(
        model,
        prompts,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        max_new_tokens=args.max_new_tokens,
        space=space,
        repeats=args.repeats,
        progress=show,
    )
    report = {"calibration_prompts": len(prompts), "trials": [asdict(t) for t in trials]}
    path = save_decode_config(args.model, best, extra=report)
    win = next(t for t in trials if t.config == asdict(best))
    print(
        f"best: n={best.block_size} K={best.num_blocks} pool={best.pool_size} r={best.spawn_ratio} "
        f"seeded={best.seed_drafts}: "
        f"TPS {win.tps:.1f}, TPF {win.tpf:.2f}; saved {path}"
    )
    return 0


def register_tune(sub) -> None:
    from jf_cli.main import _positive, add_threads_option

    p = sub.add_parser("tune", help="search (n, K, pool_size, r) for the best TPS here; save the model's decode config")
    p.add_argument("--model", required=True, help="model directory (decode_config.json is written into it)")
    p.add_argument("--num-prompts", type=_positive("--num-prompts"), default=12)
    p.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=160)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--num-blocks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--pool-sizes", type=int, nargs="+", default=[0, 2, 4])
    p.add_argument("--spawn-ratios", type=float, nargs="+", default=[0.5, 0.85])
    p.add_argument("--ngrams", type=int, nargs="+", default=[0, 8], help="recycled candidate lengths (0: n - 1)")
    p.add_argument(
        "--seed-drafts", type=int, nargs="+", choices=[0, 1], default=[0, 1], help="fresh drafts from recycled n-grams"
    )
    p.add_argument("--repeats", type=_positive("--repeats"), default=2, help="runs per candidate, fastest kept")
    add_threads_option(p)
    p.set_defaults(func=cmd_tune)
