"""vLLM from the main environment: `jf serve --engine vllm MODEL` and `jf bench vllm MODEL`.

Both resolve MODEL here (a registered `models:/<name>@champion` is downloaded once, as everywhere) and run vLLM in
its own environment (scripts/setup_vllm.sh) as a subprocess, with the Jacobi plugin (jf_vllm) as its proposer."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from jf_cli.common import positive


def serve_vllm(args: argparse.Namespace, path: str, name: str) -> int:
    from jf_vllm.launch import draft_adapter_notice, serve_argv, vllm_env

    if notice := draft_adapter_notice(path):
        print(notice, file=sys.stderr, flush=True)
    argv = serve_argv(
        path,
        name=name,
        host=args.host,
        port=args.port,
        max_num_seqs=args.max_batch,
        method=args.method,
        dtype=args.dtype,
    )
    print(f"serving {name!r} with vLLM at http://{args.host}:{args.port}/v1 once it is up (Ctrl-C stops)", flush=True)
    print("  " + " ".join(argv), flush=True)
    proc = subprocess.Popen(argv, env=vllm_env())
    # SIGTERM to jf is SIGTERM to vLLM: it shuts its engine processes down itself.
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def bench_prompts(args: argparse.Namespace) -> tuple[str, list[list[int]]]:
    """The model's directory and the profile's evaluation prompts as token ids (the same prompts as `jf bench
    serve`), so that every method, in either environment, decodes the same ids."""
    from jf_cli.common import bench_prompts as prompt_texts

    path, _, tok, texts = prompt_texts(args)
    return path, [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def format_rows(rows: list[dict]) -> str:
    lines = [
        f"{'method':<12} {'batch':>5} {'tok/s':>8} {'TPF':>6} {'x vLLM AR':>10} {'step cost':>10} {'= vLLM AR':>10}",
    ]
    for r in sorted(rows, key=lambda r: (r["batch_size"], r["method"])):
        speedup, cost = r["speedup_vs_vllm_ar"], r["step_cost_vs_vllm_ar"]
        same = r["identical_to_vllm_ar"]
        lines.append(
            f"{r['method']:<12} {r['batch_size']:>5} {r['tps']:>8.1f} {r['tpf']:>6.2f} "
            f"{'-' if speedup is None else f'{speedup:.2f}x':>10} {'-' if cost is None else f'{cost:.2f}':>10} "
            f"{'-' if same is None else f'{same:.0%}':>10}"
        )
    return "\n".join(lines)


def cmd_bench_vllm(args: argparse.Namespace) -> int:
    from jf_vllm.launch import draft_adapter_notice, vllm_bin, vllm_env

    path, prompts = bench_prompts(args)
    if notice := draft_adapter_notice(path):
        print(notice, file=sys.stderr, flush=True)
    out = Path(args.json) if args.json else None
    with tempfile.TemporaryDirectory(prefix="jf-bench-vllm-") as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        result_file = out or Path(tmp) / "result.json"
        argv = [
            str(vllm_bin()), "-m", "jf_vllm.compare",
            "--model", path,
            "--prompts", str(prompts_file),
            "--out", str(result_file),
            "--methods", args.methods,
            "--batch-sizes", ",".join(map(str, args.batch_sizes)),
            "--rounds", str(args.rounds),
            "--max-tokens", str(args.max_tokens),
            "--ar-above-batch", args.ar_above_batch,
        ]  # fmt: skip
        if args.block_size:
            argv += ["--block-size", str(args.block_size)]
        if args.threads:
            argv += ["--threads", str(args.threads)]
        if args.eager:
            argv.append("--eager")
        print(f"jf bench vllm: {len(prompts)} prompts, {path}", file=sys.stderr, flush=True)
        code = subprocess.call(argv, env=vllm_env())
        if code != 0:
            print(f"jf bench vllm: the vLLM run failed (exit {code})", file=sys.stderr)
            return code
        result = json.loads(result_file.read_text())
    print(format_rows(result["rows"]))
    not_identical = [
        f"{r['method']} at batch {r['batch_size']}: {r['identical_to_vllm_ar']:.0%}"
        for r in result["rows"]
        if r["method"] == "vllm_jacobi" and r["identical_to_vllm_ar"] is not None and r["identical_to_vllm_ar"] < 1
    ]
    for line in not_identical:
        print(f"problem: vLLM + Jacobi plugin is not vLLM's greedy AR on every prompt: {line}", file=sys.stderr)
    return 1 if not_identical else 0


def register_bench(bench_sub) -> None:
    p = bench_sub.add_parser(
        "vllm", help="vLLM AR, vLLM + Jacobi plugin, vLLM n-gram, our AR and our Jacobi, taking turns (vLLM's env)"
    )
    p.add_argument("model", help="checkpoint directory, models:/<name>@<alias>, package:<name> or embedded")
    p.add_argument("--profile", default="tiny", help="its evaluation benchmark and prompt format give the prompts")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    p.add_argument("--num-prompts", type=positive("--num-prompts"), default=64, help="prompts per turn")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16], help="requests in flight together")
    p.add_argument("--rounds", type=positive("--rounds"), default=2, help="times every method takes its turn")
    p.add_argument("--max-tokens", type=positive("--max-tokens"), default=64, help="new tokens per prompt at most")
    p.add_argument(
        "--methods",
        default="vllm_ar,vllm_jacobi,vllm_ngram,ours_ar,ours_jacobi",
        help="comma-separated, of vllm_ar, vllm_jacobi, vllm_ngram, ours_ar, ours_jacobi",
    )
    p.add_argument("--block-size", type=int, help="Jacobi block size (default: the model's stored decode config)")
    p.add_argument(
        "--ar-above-batch", default="stored", help="the gating crossover: 'stored' (the model's), 'none' or a size"
    )
    p.add_argument("--threads", type=int, help="torch threads of our own decoders (default: torch's)")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (faster start, slower steps)")
    p.add_argument("--json", help="also write the full result (rows, turns, tokens) here")
    p.set_defaults(func=cmd_bench_vllm)
