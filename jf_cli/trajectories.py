"""`jf trajectories generate|show`."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from jf_cli.common import model_path, positive


def cmd_generate(args: argparse.Namespace) -> int:
    from jacobi_forcing.tasks.trajectories import generate_trajectories
    from jf_core.config import load_profile

    profile = load_profile(
        args.profile,
        prompts={"limit": args.num_prompts, "source": args.prompts},
        trajectory={
            "block_size": args.block_size,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "max_new_tokens": args.max_new_tokens,
        },
        compute={"workers": args.workers, "ray_address": args.ray_address},
    )
    summary = generate_trajectories(profile, args.out)
    print(
        f"{summary.prompts} prompts -> {summary.rows} block records in {summary.shards} shards "
        f"({summary.shards_generated} generated now, {summary.shards - summary.shards_generated} already done) "
        f"at {args.out}"
    )
    if summary.skipped:
        print(f"skipped prompts: {json.dumps(summary.skipped)}")
    if summary.shards_generated:
        print(
            f"{summary.new_tokens_generated} tokens generated in {summary.pool_seconds:.1f} s "
            f"({summary.tokens_per_second:.0f} tokens/s); {summary.seconds:.1f} s end to end"
        )
    return 0


def _decode_tokens(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids] if tokenizer is not None else [str(i) for i in ids]


def cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from jf_core.trajectory.store import TrajectoryStore

    store = TrajectoryStore(args.dir)
    table = store.read()
    rows = table.to_pylist()
    console = Console()
    tokenizer = None
    model = store.manifest().get("meta", {}).get("model")
    if model:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        except (OSError, ValueError):
            tokenizer = None  # show token ids instead
    prompt_ids = sorted({r["prompt_id"] for r in rows})
    chosen = args.prompt_id or (prompt_ids[0] if prompt_ids else None)
    if chosen not in prompt_ids:
        raise ValueError(f"no prompt {chosen!r} in {args.dir}; e.g. {', '.join(prompt_ids[:5])}")
    blocks = sorted((r for r in rows if r["prompt_id"] == chosen), key=lambda r: r["block_index"])
    console.print(f"[bold]prompt {chosen}[/bold] ({len(blocks)} blocks, n={blocks[0]['n']})")
    if tokenizer is not None:
        console.print(repr(tokenizer.decode(blocks[0]["prompt_ids"])))
    for r in blocks:
        console.print(
            f"\n[bold]block {r['block_index']}[/bold]: {r['iterations']} iterations to the fixed point "
            f"(length {r['length']})"
        )
        fixed = r["fixed_point"]
        for step, state in enumerate(r["states"]):
            converged = next((i for i, (a, b) in enumerate(zip(state, fixed, strict=True)) if a != b), len(fixed))
            line = Text(f"  {step:>3} ")
            pieces = _decode_tokens(tokenizer, state)
            line.append("".join(pieces[:converged]), style="bold green")
            line.append("".join(pieces[converged:]), style="dim")
            line.append(f"   [{converged}/{len(fixed)} converged]")
            console.print(line)
    iterations = Counter(r["iterations"] for r in rows)
    tokens = sum(r["length"] for r in rows)
    forwards = sum(r["iterations"] + 1 for r in rows)  # + the forward that confirms each fixed point
    console.print(f"\n[bold]summary[/bold] {len(prompt_ids)} prompts, {len(rows)} blocks")
    console.print("iterations per block: " + ", ".join(f"{k}: {v}" for k, v in sorted(iterations.items())))
    console.print(f"implied TPF (decode forwards, prefill excluded): {tokens / forwards:.2f}")
    return 0


def register(sub) -> None:
    traj = sub.add_parser("trajectories", help="generate and inspect Jacobi trajectories")
    traj_sub = traj.add_subparsers(dest="trajectories", required=True)
    p = traj_sub.add_parser("generate", help="collect trajectories over a Ray actor pool into Parquet shards")
    p.add_argument("--profile", default="tiny", help="profile name or YAML path")
    p.add_argument("--out", required=True, help="the trajectory store's directory (resumes the shards it holds)")
    p.add_argument(
        "--num-prompts", type=positive("--num-prompts"), help="prompts to use (default: the profile's limit)"
    )
    p.add_argument("--prompts", help="prompt source overriding the profile's (JSONL, Parquet, datasets dir or hub id)")
    p.add_argument("--block-size", type=positive("--block-size"), help="Jacobi block size n (default: the profile's)")
    p.add_argument("--batch-size", type=positive("--batch-size"), help="prompts decoded together per actor")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), help="tokens per prompt")
    p.add_argument("--workers", type=positive("--workers"), help="Ray actors (default: the profile's)")
    p.add_argument("--seed", type=int, help="seed of the initial drafts (default: the profile's)")
    p.add_argument("--ray-address", help="join this Ray cluster (token auth) instead of starting a private one")
    p.set_defaults(func=cmd_generate)
    p = traj_sub.add_parser("show", help="how each block converged, drafts per iteration, and a summary")
    p.add_argument("dir", help="a trajectory store's directory")
    p.add_argument("--prompt-id", help="the prompt to show (default: the first)")
    p.set_defaults(func=cmd_show)
    p = traj_sub.add_parser("verify", help="read back with datasets and check every fixed point against greedy AR")
    p.add_argument("dir", help="a trajectory store's directory")
    p.set_defaults(func=cmd_verify)


def register_bench(bench_sub) -> None:
    p = bench_sub.add_parser("trajectories", help="trajectory collection throughput: batching and actor scaling")
    p.add_argument("--profile", default="tiny", help="profile name or YAML path")
    p.add_argument("--num-prompts", type=positive("--num-prompts"), default=64, help="prompts per measurement")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=16, help="the batch compared with batch 1")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Ratios measured side by side in this run: batched vs batch-1 collection (one process, one thread), and
    2 Ray actors vs 1 (one thread each; pool throughput, actor start-up and model loading excluded)."""
    import tempfile

    import torch

    from jacobi_forcing.tasks.trajectories import generate_trajectories
    from jf_core.config import load_profile
    from jf_core.models import load_model
    from jf_core.trajectory.collect import CollectConfig, collect
    from jf_core.trajectory.prompts import load_prompts

    profile = load_profile(args.profile, prompts={"limit": args.num_prompts})
    model, tokenizer = load_model(model_path(None, profile), dtype=profile.model.dtype)
    torch.set_num_threads(1)
    t = profile.trajectory
    items = load_prompts(profile.prompts, tokenizer).items
    rates = {}
    for batch in (1, args.batch_size):
        cfg = CollectConfig(block_size=t.block_size, max_new_tokens=t.max_new_tokens, batch_size=batch)
        collect(model, tokenizer, items[:2], cfg, model_hash="warmup")
        result = collect(model, tokenizer, items, cfg, model_hash="bench")
        rates[f"batch {batch}"] = result.new_tokens / result.seconds
    for workers in (1, 2):
        p = profile.model_copy(
            update={"compute": profile.compute.model_copy(update={"workers": workers, "cpus_per_worker": 1})}
        )
        with tempfile.TemporaryDirectory() as out:
            summary = generate_trajectories(p, out, progress=False)
        rates[f"{workers} actor(s)"] = summary.tokens_per_second
    print(f"{'setting':<14} {'tokens/s':>10}")
    for name, rate in rates.items():
        print(f"{name:<14} {rate:>10.1f}")
    print(f"batched (batch {args.batch_size}) / batch 1: {rates[f'batch {args.batch_size}'] / rates['batch 1']:.2f}x")
    print(f"2 actors / 1 actor: {rates['2 actor(s)'] / rates['1 actor(s)']:.2f}x")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Read the store back with `datasets` (schema and records validated), then re-decode every prompt with greedy
    AR in the dtype the trajectories were made in and compare each block's fixed point with AR's tokens for that
    block: in fp32 they must be equal; in bf16/fp16 near-tied argmaxes may flip between a wide window and a
    one-token step, so the agreement is reported, not required."""
    from collections import defaultdict

    import torch

    from jf_core.decoding import ar_decode
    from jf_core.models import load_model, stop_tokens
    from jf_core.trajectory.store import TrajectoryStore

    store = TrajectoryStore(args.dir)
    ds = store.dataset()
    meta = store.manifest()["meta"]
    dtype = meta.get("dtype", "float32")
    model, tokenizer = load_model(meta["model"], dtype=dtype)
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for row in ds:
        by_prompt[row["prompt_id"]].append(row)
    ids = sorted(by_prompt)
    first_is_known = sum(r["states"][0][0] == r["fixed_point"][0] for r in ds)
    mismatches = 0
    with torch.inference_mode():
        for start in range(0, len(ids), 64):
            chunk = ids[start : start + 64]
            prompts = [by_prompt[i][0]["prompt_ids"] for i in chunk]
            budget = max(sum(r["n"] for r in by_prompt[i]) for i in chunk)
            greedy = ar_decode(
                model,
                prompts,
                max_new_tokens=budget,
                stop=stop_tokens(model, tokenizer),
            ).sequences
            for pid, expected in zip(chunk, greedy, strict=True):
                rows = sorted(by_prompt[pid], key=lambda r: r["block_index"])
                got = [t for r in rows for t in r["fixed_point"][: r["length"]]]
                mismatches += got != expected[: len(got)]
    print(f"{len(ds)} records of {len(ids)} prompts read with datasets; schema and record rules valid")
    print(f"initial draft starts with the block's known token in {first_is_known}/{len(ds)} records")
    print(f"fixed points equal greedy AR output ({dtype}) for {len(ids) - mismatches}/{len(ids)} prompts")
    exact = dtype in ("float32", "float64")
    if mismatches and not exact:
        print(f"{dtype}: reported, not an error (a wide window and a one-token step round near-ties differently)")
    return 0 if (mismatches == 0 or not exact) and first_is_known == len(ds) else 1
