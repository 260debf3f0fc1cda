"""What grouping a layer's projections of one input saves (jf_core/layers/siblings.py): our AR's cycle and each decode
config's (`jf bench cycle`'s measure, every output checked against AR's) with q, k, v and gate, up grouped and
ungrouped, the two forms taking turns round by round in one run.

    .venv/bin/python bench/siblings.py --model BASE --num-prompts 4 --max-new-tokens 96 --rounds 2 \
        --config 'mlp@ADAPTER:{"block_size": 8, "num_blocks": 1, "pool_size": 0, "draft_span": 3, "lookup": 16}'

`--config NAME[@MODEL]:{fields}` as in `jf bench cycle` (a JFDecodeConfig's fields; on MODEL, another adapter on the
same base). Prompts are the profile's development half of the held-out questions. Run it alone: a neighbour's time
slices land in whichever form is running.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from dataclasses import replace

import torch

from jf_cli.cycle import config_item
from jf_core.config import load_profile, parse_overrides
from jf_core.decoding import JFDecodeConfig, load_serving_spec
from jf_core.evaluation.cycle_cost import AR_NAME, measure_cycles
from jf_core.evaluation.evaluate import eval_set
from jf_core.layers.siblings import ungrouped
from jf_core.model_ref import resolve_model
from jf_core.models import load_model, stop_tokens
from jf_core.trajectory.prompts import PromptFormat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--model", required=True, help="the base: our AR runs on it")
    ap.add_argument("--config", type=config_item, action="append", required=True)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2, help="times each form takes its turn")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set))
    kwargs = profile.model.decode_kwargs()
    model, tok = load_model(resolve_model(args.model), **kwargs)
    configs = {}
    for name, other, changes in args.config:
        on = load_model(resolve_model(other), **kwargs)[0] if other else model
        tuned = load_serving_spec(resolve_model(other or args.model)).tuned or JFDecodeConfig()
        configs[name] = (on, replace(tuned, **changes))
    fmt = PromptFormat.of(profile.prompts)
    prompts = eval_set(profile.evaluation, tok, fmt, part="development", limit=args.num_prompts).prompts
    forms = {"ungrouped": ungrouped, "grouped": contextlib.nullcontext}
    cycle_ms: dict[str, dict[str, list[float]]] = {form: {} for form in forms}
    for r in range(args.rounds):
        for form, context in forms.items() if r % 2 == 0 else reversed(forms.items()):
            with context():
                costs = measure_cycles(model, prompts, configs, max_new_tokens=args.max_new_tokens,
                                       stop=stop_tokens(model, tok))  # fmt: skip
            for name, cost in costs.items():
                cycle_ms[form].setdefault(name, []).append(cost.ms("cycle"))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print("| method | ungrouped: ms a cycle, AR steps | grouped: ms a cycle, AR steps | grouped speedup |")
    print("|---|---|---|---|")
    for name in cycle_ms["grouped"]:
        cells = []
        for form in forms:
            ms = statistics.median(cycle_ms[form][name])
            cells.append(f"{ms:.1f}, {ms / statistics.median(cycle_ms[form][AR_NAME]):.2f}")
        gain = statistics.median(cycle_ms["ungrouped"][name]) / statistics.median(cycle_ms["grouped"][name])
        print(f"| {name} | {cells[0]} | {cells[1]} | {gain:.3f}x |")


if __name__ == "__main__":
    main()
