"""Bootstrap training speed on a shared CPU under each thread policy of `ThreadGovernor.for_training`.

`fixed` is the default (every CPU this process may use, for the whole run: the model does not follow the load),
`fixed-1` is `compute.threads: 1`, `adaptive` is `compute.adaptive_threads: true` (the free CPUs, re-measured).

Each measurement is a fresh process training the embedded model's bootstrap recipe (its model, data and batch size)
for `--steps` steps, alone or beside 1 or 2 busy processes (a Python spin loop each). The two policies take turns
inside each condition, and the whole grid repeats `--repeats` times; the table gives the median steps/s and the
ratio to the same policy alone. Run it with nothing else on the machine.

    .venv/bin/python bench/cpu_threads.py --steps 120 --repeats 2 [--busy 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

POLICIES = ("fixed", "fixed-1", "adaptive")

WORKER = """
import json, sys, time
import torch
from jf_core.threads import ThreadGovernor
from jf_core.toy.bootstrap import BootstrapConfig
from jf_core.toy.data import ar_batches
from jf_core.toy.model import build_model
from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.training.trainer import TrainConfig, causal_lm_loss, train

policy, steps = sys.argv[1], int(sys.argv[2])
cfg = BootstrapConfig()
tok = build_tokenizer()
model = build_model(cfg.model, len(tok), tok.pad_token_id, tok.eos_token_id, 0)
times = {}
governor = {
    "fixed": ThreadGovernor.for_training(),
    "fixed-1": ThreadGovernor.for_training(1),
    "adaptive": ThreadGovernor.for_training(adaptive=True),
}[policy]
result = train(
    model,
    ar_batches(tok, make_split("train", 8_000, cfg.task), cfg.batch_size, 0),
    causal_lm_loss,
    TrainConfig(steps=steps, lr=3e-3, warmup_steps=10, log_every=10),
    progress=False,
    on_log=lambda step, row: times.setdefault(step, time.perf_counter()),
    threads=governor,
)
first, last = 10, max(times)
rate = (last - first) / (times[last] - times[first])
print(json.dumps({"steps_per_s": rate, "threads": result.threads.model_dump()}))
"""


def measure(policy: str, busy: int, steps: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5)  # let the spinners take their cores before the trainer looks
        out = subprocess.run(
            [sys.executable, "-c", WORKER, policy, str(steps)], capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy processes beside the training")
    args = ap.parse_args()
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.repeats):
        for busy in args.busy:
            for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                got = measure(policy, busy, args.steps)
                runs.setdefault((policy, busy), []).append(got)
                print(f"repeat {r} busy {busy} {policy}: {got['steps_per_s']:.2f} steps/s, threads {got['threads']}")
    print("\n| policy | busy processes | steps/s (median) | of alone | threads used |")
    print("|---|---|---|---|---|")
    for policy in POLICIES:
        alone = statistics.median(x["steps_per_s"] for x in runs[(policy, 0)])
        for busy in args.busy:
            rates = [x["steps_per_s"] for x in runs[(policy, busy)]]
            used = sorted({n for x in runs[(policy, busy)] for _, n in x["threads"]["changes"]})
            med = statistics.median(rates)
            print(f"| {policy} | {busy} | {med:.2f} | {med / alone:.0%} | {used} |")


if __name__ == "__main__":
    main()
