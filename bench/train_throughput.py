"""Training throughput: packed training tokens per second for each recipe option, the options taking turns in one
run on the same trajectories, through the round's own packing and driver (`pack_records`, `train_round`).

    .venv/bin/python bench/train_throughput.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl --questions 8 --steps 8 --repeats 2 \
        --option 'profile:{}' \
        --option 'each_visit_clean:{"state_pick": "each_visit", "mask": "clean_context"}' \
        --option 'full_head:{"lean_loss": false}' \
        --option 'two_a_batch:{"batch_size": 2, "grad_accum": 1}' \
        --option 'one_thread:{"threads": 1}'

Each `--option NAME:JSON` is a set of `training` overrides (plus `threads`, torch's intra-op threads; default
`--threads`; and `off`, a list of the library's switches turned off for the option's runs, `SWITCHES`: a step as it
ran before a change, beside it). A step's time is the median of steps 1 to `--steps` - 1 from the training history's
`elapsed_s` (step 0 pays for first-touch allocations); its tokens are the tokens the trainer counted in those steps'
batches (`tokens_seen`), padding not counted, every noisy copy a visit draws counted (`training.noisy_copies`), in
the option's layout (`training.packing`); "students" are the consistency loss's positions, what a step trains
whatever the layout packs around them (the layouts are compared by these and by the step, not by tokens: spans pack
fewer tokens for the same students). The table gives the median over `--repeats` and the ratio to the first option.
Trajectories are synthetic (greedy AR + corrupted tails): the same packed shapes as Jacobi's at a fraction of the
cost. Run it alone: a neighbour's time slices land in whichever option is running.

`--flops`: each option against this machine's limit. Its step's FLOPs are counted by torch's FlopCounterMode over
one more run of the same steps (the matmuls and attention, forward and backward, as autograd dispatches them; the
lean head's one check forward before training is counted too, under 1% of a 24-step run), and the limit is the
fastest matmul this process measures in the dtype the option computes in (`training.compute_dtype`, as the run
resolved it), at a SmolLM2 MLP's shape and at 1024 cubed, on the same threads: "of peak" is the step's FLOPs a
second over that.

`--ops K`: where each option's step goes: one more run of its steps under torch's profiler, and the K ops with the
most self CPU time, in ms a step (the run's setup is in it too: the lean head's check forward and step 0's first
touches), by op and by op and input shapes.

`--stretch N`: each run's steps also in stretches of N (the step, the kept contexts' passes, the rest, hits a step):
whether a long run slows as it goes, and in which part. The run ends with the oneDNN primitive cache it ran under
(jf_core/onednn.py; `ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024` in the environment runs oneDNN's default) and the
process's peak RSS. `--collect-batch-size`: questions decoded together for
the trajectories (all at once by default, slow past about a hundred).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from jf_cli.common import named_overrides
from jf_core.config import load_profile, parse_overrides
from jf_core.decoding.grouped_attention import kernel_backward
from jf_core.experiments.variants import variant_profile
from jf_core.layers.heads import uncast_head
from jf_core.layers.packed import uncached_casts
from jf_core.layers.siblings import ungrouped
from jf_core.model_ref import resolve_model
from jf_core.models import load_model
from jf_core.onednn import CACHE_ENV, size_primitive_cache
from jf_core.training.head import checkpointed_heads
from jf_core.training.losses import ar_term_kept
from jf_core.trajectory.collect import collect
from jf_core.trajectory.prompts import load_prompts

# What an option's `off` may name: each a change the step runs with, switched off to measure what it saves.
SWITCHES = {
    "eager_backward": kernel_backward,  # bf16 attention's gradient by the eager form (grouped_attention.py)
    "head_cast": uncast_head,  # the LM head's frozen weight cast once (layers/heads.py)
    "casts": uncached_casts,  # every frozen projection's weight cast once (layers/packed.py)
    "grouped": ungrouped,  # a layer's projections of one input as one product (layers/siblings.py)
    "gradient_now": checkpointed_heads,  # a frozen head's loss chunks take their gradient as computed (head.py)
    "ar_cut": ar_term_kept,  # the AR term left out where no gradient reaches it (losses.py)
}
NOT_TRAINING = ("threads", "off")


def switched(overrides: dict) -> contextlib.ExitStack:
    """The option's `off` switches turned off while the stack is open."""
    stack = contextlib.ExitStack()
    for name in overrides.get("off", ()):
        if name not in SWITCHES:
            raise ValueError(f"--option off: unknown switch {name!r} (known: {', '.join(SWITCHES)})")
        stack.enter_context(SWITCHES[name]())
    return stack


def training_overrides(overrides: dict, args) -> dict:
    """An option's `training` overrides, its torch threads set for the run that follows."""
    torch.set_num_threads(overrides.get("threads", args.threads))
    return {k: v for k, v in overrides.items() if k not in NOT_TRAINING}


def step_seconds(history: list[dict]) -> float:
    """Median seconds a step from consecutive logged rows (log every step), leaving step 0 out."""
    rows = [h for h in history if "elapsed_s" in h]
    gaps = [(b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"]) for a, b in itertools.pairwise(rows)]
    if not gaps:
        raise ValueError("need at least two logged steps: --steps must be >= 2")
    return statistics.median(gaps)


def stretches(history: list[dict], every: int) -> list[dict]:
    """A long run's steps in stretches of `every`: each stretch's mean step seconds, the part the kept contexts'
    passes took (`context_miss_s`, 0 without a store), the rest, and the hits a step. Whether a run slows as it
    goes, and in which part, is read off these (a store's slowdown was found so)."""
    rows = [h for h in history if "elapsed_s" in h]
    gaps = [
        (b["step"], b["elapsed_s"] - a["elapsed_s"], b.get("context_miss_s", 0.0) - a.get("context_miss_s", 0.0),
         b.get("context_hits", 0.0) - a.get("context_hits", 0.0))
        for a, b in itertools.pairwise(rows) if b["step"] == a["step"] + 1
    ]  # fmt: skip
    out = []
    for start in range(0, int(max((g[0] for g in gaps), default=0)) + 1, every):
        part = [g for g in gaps if start <= g[0] < start + every]
        if part:
            step, passes = statistics.fmean(g[1] for g in part), statistics.fmean(g[2] for g in part)
            out.append({"steps": f"{start}-{start + every - 1}", "step_s": step, "context_pass_s": passes,
                        "rest_s": step - passes, "hits_a_step": statistics.fmean(g[3] for g in part)})  # fmt: skip
    return out


def train_on_records(profile, model_dir: str, records: list[dict], where: Path):
    """The round's packing and driver on `records`, in `where`, logging every step: (training's summary, the packed
    examples)."""
    from jf_core.round.stages import pack_to
    from jf_core.round.training import train_round

    packed, _ = pack_to(profile, records, where / "examples.parquet")
    summary = train_round(profile, model_dir, where / "examples.parquet", where / "checkpoints", where / "model",
                          device=torch.device("cpu"), log_every=1)  # fmt: skip
    return summary, packed


def matmul_gflops(dtype: torch.dtype, repeats: int = 20) -> float:
    """This machine's matmul GFLOP/s in `dtype` on torch's current threads: the fastest of a SmolLM2 MLP's product
    (512 tokens x 576 -> 1536) and a 1024-cube product, each timed over `repeats` after a warm-up."""
    best = 0.0
    for m, k, n in ((512, 576, 1536), (1024, 1024, 1024)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            a @ b
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * m * k * n * repeats / (time.perf_counter() - start) / 1e9)
    return best


def counted_flops(
    profile, model_dir: str, records: list[dict], overrides: dict, steps: int, where: Path
) -> tuple[float, str]:
    """(FLOPs a step of `overrides`' training, the dtype it computed in): FlopCounterMode over a whole run of
    `steps` steps, divided by them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        row = measure(profile, model_dir, records, overrides, steps, where)
    return counter.get_total_flops() / steps, row["compute_dtype"]


def timed_profile(profile, overrides: dict, steps: int):
    """The profile an option's timed run trains with: its overrides, `steps` steps, no warm-up, no checkpoint, and
    neither probes nor on-policy decodes, which are not training steps. Those two are switched off on the validated
    profile: an override of None reads as "not given" (`merge_overrides`), so passed as overrides they stayed on,
    and the profile's probe every 200 steps ran inside a long run's timed steps."""
    timed = {**overrides, "steps": steps, "warmup_steps": 0, "checkpoint_every": 10**6}
    p = variant_profile(profile, {"training": timed})
    off = {"tpf_probe_every": None, "onpolicy_every": None}
    return p.model_copy(update={"training": p.training.model_copy(update=off)})


def measure(profile, model_dir: str, records: list[dict], overrides: dict, steps: int, where: Path) -> dict:
    p = timed_profile(profile, overrides, steps)
    summary, _ = train_on_records(p, model_dir, records, where)
    seconds = step_seconds(summary.history)
    tokens = summary.history[-1]["tokens_seen"] / steps
    students = statistics.fmean(h["consistency_positions"] for h in summary.history if "consistency_positions" in h)
    # With the history (a row a step: elapsed_s, tokens_seen, the kept contexts' hits and misses) for --out.
    return {"step_seconds": seconds, "tokens_per_step": tokens, "tokens_per_s": tokens / seconds,
            "students_per_step": students, "students_per_s": students / seconds,
            "compute_dtype": summary.compute_dtype, "history": summary.history}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")
    ap.add_argument("--option", type=named_overrides("--option"), action="append", required=True, metavar="NAME:JSON")
    ap.add_argument("--questions", type=int, default=8, help="train-split questions whose trajectories are packed")
    ap.add_argument("--max-new-tokens", type=int, help="answer length (default: the profile's trajectories')")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON with every measurement (each run's training history, a row a step)")
    ap.add_argument("--flops", action="store_true", help="each option's FLOPs a step against this machine's matmuls")
    ap.add_argument(
        "--ops", type=int, metavar="K", help="each option's K ops of most self time, under torch's profiler"
    )
    ap.add_argument("--stretch", type=int, metavar="N", help="also print each run's steps in stretches of N")
    ap.add_argument("--collect-batch-size", type=int, help="questions decoded together (default: all at once)")
    args = ap.parse_args()
    size_primitive_cache()
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set or []))
    model_dir = resolve_model(profile.model.path)
    model, tok = load_model(model_dir, dtype="float32")
    items = load_prompts(profile.prompts.model_copy(update={"split": "train", "limit": args.questions}), tok).items
    update = {"kind": "synthetic", "batch_size": args.collect_batch_size or len(items)}
    if args.max_new_tokens:
        update["max_new_tokens"] = args.max_new_tokens
    records = collect(model, tok, items, profile.trajectory.model_copy(update=update).collect_config(),
                      model_hash="bench").records  # fmt: skip
    del model
    options = dict(args.option)
    rows: dict[str, list[dict]] = {name: [] for name in options}
    scratch = Path(tempfile.mkdtemp(prefix="jf-throughput-"))
    try:
        for r in range(args.repeats):
            for name, overrides in options.items():  # taking turns: a slow minute of the machine hits every option
                training = training_overrides(overrides, args)
                with switched(overrides):
                    row = measure(profile, model_dir, records, training, args.steps, scratch / f"{name}-{r}")
                shutil.rmtree(scratch / f"{name}-{r}")  # a SmolLM2 model directory is 540 MB
                rows[name].append(row)
                speed = f"{row['tokens_per_s']:.1f} tokens/s, {row['step_seconds']:.2f} s a step"
                print(f"{name} (repeat {r + 1}): {speed}", flush=True)
                for part in stretches(row["history"], args.stretch) if args.stretch else ():
                    print(f"  steps {part['steps']}: {part['step_s']:.2f} s a step, context passes "
                          f"{part['context_pass_s']:.2f}, the rest {part['rest_s']:.2f}, "
                          f"{part['hits_a_step']:.2f} hits", flush=True)  # fmt: skip
        flops = {}
        if args.flops:
            flops = {name: against_limit(profile, model_dir, records, overrides, args, scratch / f"{name}-flops")
                     for name, overrides in options.items()}  # fmt: skip
        ops = {}
        if args.ops:
            ops = {name: top_ops(profile, model_dir, records, overrides, args, scratch / f"{name}-ops")
                   for name, overrides in options.items()}  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    first = rows[next(iter(options))]
    first_tps = statistics.median(x["tokens_per_s"] for x in first)
    first_students = statistics.median(x["students_per_s"] for x in first)
    print("\n| option | tokens/s (median) | s a step | tokens a step | vs first | students/s | students a step "
          "| vs first |"
          "\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name, runs in rows.items():
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        students = statistics.median(x["students_per_s"] for x in runs)
        step = statistics.median(x["step_seconds"] for x in runs)
        per_step = runs[0]["students_per_step"]
        print(f"| {name} | {tps:.1f} | {step:.2f} | {runs[0]['tokens_per_step']:.0f} | {tps / first_tps:.2f}x "
              f"| {students:.1f} | {per_step:.0f} | {students / first_students:.2f}x |")  # fmt: skip
    if flops:
        print("\n| option | GFLOP a step | GFLOP/s | of peak | peak GFLOP/s (dtype) |\n|---|---|---|---|---|")
        for name, runs in rows.items():
            step = statistics.median(x["step_seconds"] for x in runs)
            f = flops[name]
            achieved = f["gflop_per_step"] / step
            f.update(gflops=achieved, of_peak=achieved / f["peak_gflops"])
            print(f"| {name} | {f['gflop_per_step']:.1f} | {achieved:.1f} | {f['of_peak']:.0%} "
                  f"| {f['peak_gflops']:.1f} ({f['dtype']}) |")  # fmt: skip
    for name, found in ops.items():
        print(f"\n| {name}: op | calls | ms a step |\n|---|---|---|")
        for op in found["by_op"]:
            print(f"| {op['op']} | {op['calls']} | {op['ms_a_step']:.1f} |")
    # What the process ran under: oneDNN's cache as jf sizes it, or as ONEDNN_PRIMITIVE_CACHE_CAPACITY named it (a
    # run under oneDNN's default sets 1024), and the memory the cached primitives and the run took at their peak.
    process = {"onednn_cache_capacity": int(os.environ[CACHE_ENV]),
               "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
    print(f"\noneDNN primitive cache: {process['onednn_cache_capacity']}; peak RSS {process['max_rss_mb']:.0f} MB")
    if args.out:
        Path(args.out).write_text(json.dumps({"options": options, "rows": rows, "flops": flops, "ops": ops,
                                              "process": process}, indent=2))  # fmt: skip
    return 0


def against_limit(profile, model_dir: str, records: list[dict], overrides: dict, args, where: Path) -> dict:
    """An option's FLOPs a step and this machine's matmul GFLOP/s in the dtype it computes in, on its threads."""
    training = training_overrides(overrides, args)
    with switched(overrides):
        per_step, dtype = counted_flops(profile, model_dir, records, training, args.steps, where)
    shutil.rmtree(where, ignore_errors=True)
    return {"gflop_per_step": per_step / 1e9, "dtype": dtype, "peak_gflops": matmul_gflops(getattr(torch, dtype))}


def top_ops(profile, model_dir: str, records: list[dict], overrides: dict, args, where: Path) -> dict:
    """An option's `args.ops` ops of most self CPU time over one run of its steps under torch's profiler, in ms a
    step: by op, and by op and input shapes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    training = training_overrides(overrides, args)
    with switched(overrides), torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as run:
        measure(profile, model_dir, records, training, args.steps, where)
    shutil.rmtree(where, ignore_errors=True)

    def top(events) -> list[dict]:
        ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.ops]
        return [{"op": e.key, "shapes": str(e.input_shapes), "calls": e.count,
                 "ms_a_step": e.self_cpu_time_total / 1e3 / args.steps} for e in ranked]  # fmt: skip

    return {"by_op": top(run.key_averages()), "by_shape": top(run.key_averages(group_by_input_shape=True))}


if __name__ == "__main__":
    sys.exit(main())
