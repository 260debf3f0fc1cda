"""`jf serve MODEL`: the OpenAI-compatible Jacobi Forcing server (infra/serve_app.py on Ray Serve).

MODEL is a checkpoint directory, a hub id or `models:/<name>@<alias>` (downloaded once, as rounds resolve it). The
server binds 127.0.0.1 unless `--host` says otherwise; Ctrl-C (or SIGTERM) stops it and its Ray."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jf_cli.common import bench_prompts, model_path, positive


def served_name(model: str) -> str:
    """What clients send as `model`: the registered name, a directory's name, or the hub id."""
    if model.startswith("models:/"):
        return model.removeprefix("models:/").split("@")[0].split("/")[0]
    return Path(model).name if Path(model).expanduser().is_dir() else model


def cmd_serve(args: argparse.Namespace) -> int:
    path = model_path(args.model)
    name = args.name or served_name(args.model)
    if args.engine == "vllm":
        from jf_cli.vllm import serve_vllm

        return serve_vllm(args, path, name)
    from jacobi_forcing.infra.serve_app import ServeOptions, run

    options = ServeOptions(
        model_path=path,
        name=name,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        method=args.method,
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        device=args.device,
    )

    def ready(url: str) -> None:
        print(f"serving {options.name!r} at {url}/v1 (Ctrl-C stops)", flush=True)

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: nothing here authenticates clients", file=sys.stderr)
    run(options, host=args.host, port=args.port, replicas=args.replicas, ready=ready)
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import json

    from jacobi_forcing.infra.serve_app import ServeOptions
    from jacobi_forcing.infra.serve_bench import bench_serve, check, format_table

    path, profile, _, prompts = bench_prompts(args)
    cfg = profile.evaluation
    options = ServeOptions(
        model_path=path, name="bench", max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_tokens_limit=4096
    )
    results = bench_serve(
        options,
        prompts,
        clients=args.clients,
        requests_per_level=args.requests,
        max_tokens=args.max_tokens or cfg.max_new_tokens,
        repeats=args.repeats,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(format_table(results))
    problems = check(results)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if args.json:
        rows = [
            {k: v for k, v in r.__dict__.items() if k != "texts"} | {"tokens_per_second": r.tokens_per_second}
            for r in results
        ]
        Path(args.json).write_text(json.dumps({"model": path, "results": rows}, indent=2))
    return 1 if problems else 0


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible API (Ray Serve, or vLLM)")
    p.add_argument("model", help="checkpoint directory, hub id, models:/<name>@<alias> or package:<name>")
    p.add_argument(
        "--engine",
        choices=["ray", "vllm"],
        default="ray",
        help="ray: this project's decoders on Ray Serve; vllm: vLLM's engine with the Jacobi plugin as its proposer "
        "(its own environment: scripts/setup_vllm.sh)",
    )
    p.add_argument("--name", help="the model id clients send (default: from MODEL)")
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to bind (another one opens the server to the network)"
    )
    p.add_argument("--port", type=int, default=8000, help="the HTTP port")
    p.add_argument("--replicas", type=positive("--replicas"), default=1, help="Ray Serve replicas (ray engine)")
    p.add_argument("--max-batch", type=positive("--max-batch"), default=16, help="requests decoded together")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="how long a request waits for company")
    p.add_argument(
        "--method",
        choices=["auto", "jacobi", "ar"],
        default="auto",
        help="auto: the model's measured dispatch (vllm: its stored crossover as vLLM's batch-size schedule)",
    )
    p.add_argument(
        "--max-tokens-limit",
        type=positive("--max-tokens-limit"),
        default=1024,
        help="the most max_tokens a request may ask",
    )
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (the model's)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.set_defaults(func=cmd_serve)


def register_bench(bench_sub) -> None:
    p = bench_sub.add_parser("serve", help="load-test the server: dispatch vs forced Jacobi vs forced AR, loopback")
    p.add_argument("model", help="checkpoint directory, hub id, models:/<name>@<alias> or package:<name>")
    p.add_argument("--profile", default="tiny", help="its evaluation benchmark and prompt format give the prompts")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64], help="concurrent clients per level")
    p.add_argument("--requests", type=positive("--requests"), default=64, help="requests per level (>= clients)")
    p.add_argument(
        "--num-prompts", type=positive("--num-prompts"), default=64, help="distinct prompts the requests cycle through"
    )
    p.add_argument("--max-tokens", type=positive("--max-tokens"), help="default: the profile's max_new_tokens")
    p.add_argument("--max-batch", type=positive("--max-batch"), default=16, help="requests decoded together")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="how long a request waits for company")
    p.add_argument("--repeats", type=positive("--repeats"), default=1, help="runs per method and level, fastest kept")
    p.add_argument("--json", help="also write the results here")
    p.set_defaults(func=cmd_bench_serve)
