"""`jf bench cycle`: what one cycle of each decode config costs, part by part, in AR steps, at batch 1
(jf_core/evaluation/cycle_cost.py). The model's own tuned config is measured unless `--no-tuned`; each `--config
'NAME:{"field": value}'` is that config with the fields changed (a `JFDecodeConfig`'s), and `--config
'NAME@MODEL:{...}'` the same on another model's tuned config, decoded on that model (another adapter on the same
base: every output is still checked against the base's AR), so models compare in one run. Each measured speedup
comes with its 95% interval over resampled prompts; `--control` also times our AR against itself.

    jf bench cycle --profile smollm2-135m --model models:/jf-smollm2-135m@champion --num-prompts 8 \
        --config 'lookup8:{"lookup": 8}'
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from jf_cli.common import (
    UsageError,
    add_profile_options,
    add_threads_option,
    args_profile,
    model_path,
    positive,
    set_threads,
)


def config_item(text: str) -> tuple[str, str | None, dict]:
    """An argparse type for `--config 'NAME:{"lookup": 8}'` or `--config 'NAME@MODEL:{...}'` (the config decoded on
    another model, e.g. another adapter on the same base): (name, model or None, fields)."""
    head, sep, fields = text.partition(":{")
    name, _, model = head.partition("@")
    try:
        changes = json.loads("{" + fields) if sep else None
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"--config {name}: its fields are not JSON ({err})") from None
    if not name or not isinstance(changes, dict):
        raise argparse.ArgumentTypeError(f'--config takes NAME[@MODEL]:{{"field": value, ...}}, got {text!r}')
    return name, model or None, changes


def cmd_bench_cycle(args: argparse.Namespace) -> int:
    from jf_core.decoding import JFDecodeConfig, load_serving_spec
    from jf_core.evaluation.cycle_cost import (
        AR_NAME,
        CONTROL_NAME,
        cost_table,
        measure_cycles,
        slot_table,
        summary,
    )
    from jf_core.evaluation.evaluate import eval_set
    from jf_core.evaluation.tables import markdown
    from jf_core.models import load_model, stop_tokens
    from jf_core.trajectory.prompts import PromptFormat

    set_threads(args)
    profile = args_profile(args)
    path = model_path(args.model, profile)
    loaded = {path: load_model(path, **profile.model.decode_kwargs())}
    model, tok = loaded[path]
    tuned = load_serving_spec(path).tuned
    configs = {} if args.no_tuned or tuned is None else {"tuned": tuned}
    for name, other, changes in args.config or []:
        where = model_path(other, profile) if other else path
        if where not in loaded:
            loaded[where] = load_model(where, **profile.model.decode_kwargs())
        base = load_serving_spec(where).tuned or JFDecodeConfig()
        try:
            configs[name] = (loaded[where][0], replace(base, **changes))
        except (TypeError, ValueError) as err:
            raise UsageError(f"--config {name}: {err}") from None
    if not configs:
        raise UsageError(f"{path} stores no tuned config: name one with --config")
    # A layout study is a decision: it reads the development half of the held-out questions, never the reported one.
    fmt = PromptFormat.of(profile.prompts)
    data = eval_set(profile.evaluation, tok, fmt, part="development", limit=args.num_prompts)
    costs = measure_cycles(
        model,
        data.prompts,
        configs,
        max_new_tokens=args.max_new_tokens,
        stop=stop_tokens(model, tok),
        control=args.control,
        progress=lambda line: print(line, file=sys.stderr),
    )
    print(f"{path}: {len(data.prompts)} {data.benchmark} prompts, batch 1, {args.max_new_tokens} new tokens at most")
    print(markdown(*cost_table(costs)))
    spread = abs(costs[AR_NAME].wall / costs[CONTROL_NAME].wall - 1) if args.control else None
    if spread is not None:
        print(f"timing spread (AR against AR in this run): {spread:.3f}")
    print("\nWhat each slot earns (by who laid it out):")
    print(markdown(*slot_table(costs)))
    if args.json:
        with open(args.json, "w") as fh:
            figures = {"model": path, "prompts": len(data.prompts), "methods": summary(costs)}
            json.dump({**figures, **({} if spread is None else {"timing_spread": spread})}, fh, indent=2)
    return 0


def register_bench(bench_sub) -> None:
    p = bench_sub.add_parser("cycle", help="what one decoding cycle costs, part by part, in AR steps (batch 1)")
    p.add_argument("--model", help="default: the profile's; any model reference (models:/name@alias, a directory)")
    add_profile_options(p)
    p.add_argument(
        "--config", type=config_item, action="append",
        help="NAME[@MODEL]:{json fields}: the (other model's) tuned config with these fields changed",
    )  # fmt: skip
    p.add_argument("--no-tuned", action="store_true", help="leave out the model's own tuned config")
    p.add_argument("--num-prompts", type=positive("--num-prompts"), default=8, help="evaluation prompts")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=128, help="tokens per prompt")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--control", action="store_true", help="also time our AR a second time: the timer's own spread")
    add_threads_option(p)
    p.set_defaults(func=cmd_bench_cycle)
