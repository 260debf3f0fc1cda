"""What the `jf` subcommands share: the error type, how a model is named, the integer and thread options, `--set`
parsing, the profile a command runs on, and the prompts `jf bench serve` and `jf bench vllm` send.

The subcommand modules import these from here, never from `jf_cli.main` (which imports them: a cycle)."""

from __future__ import annotations

import argparse
import json


class UsageError(ValueError):
    """A bad command-line value: printed as `jf: error: ...` with exit status 2, no traceback."""


def model_path(model: str | None, profile=None) -> str:
    """Every command's model, named one way: a directory, a hub id, `models:/<name>@<alias>` or `/<version>` (the
    registered checkpoint, downloaded once per version), `package:<distribution>` (its GGUF, imported once) or
    `embedded`; None: the profile's model (the embedded one without a profile). One door:
    `tasks.model_package.resolve_model`; MLflow is imported only for a registered model, so a machine without it
    (a lent GPU's image) runs every command on a directory, a hub id or a GGUF file."""
    from jf_core import model_ref

    if model is None:
        model = profile.model.path if profile is not None else model_ref.EMBEDDED
    if not model.startswith(model_ref.REGISTRY_SCHEME):
        return model_ref.resolve_model(model)
    from jacobi_forcing.tasks.model_package import resolve_model

    return resolve_model(model, profile)


def model_and_tokenizer(model: str | None):
    from jf_core.models import load_model

    return load_model(model_path(model))


def positive(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def named_overrides(flag: str):
    """An argparse type for `NAME:JSON` (a name and a JSON object of overrides), as the benches' `--variant` and
    `--option` take them; a malformed one is refused naming `flag`."""

    def parse(text: str) -> tuple[str, dict]:

        name, sep, body = text.partition(":")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{flag} expects NAME:JSON, got {text!r}")
        try:
            overrides = json.loads(body)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"{flag} {name}: not JSON ({e})") from None
        if not isinstance(overrides, dict):
            raise argparse.ArgumentTypeError(f"{flag} {name}: expected a JSON object of overrides")
        return name, overrides

    return parse


def add_profile_options(p: argparse.ArgumentParser, what: str = "") -> None:
    """`--profile` (default tiny) and its `--set` overrides, as every profile-driven command takes them."""
    p.add_argument("--profile", default="tiny", help="profile name or YAML path" + (f": {what}" if what else ""))
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a profile field")


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=positive("--threads"),
        help="torch intra-op threads for every method (default: torch's); small CPU models often run faster on 1",
    )


def set_threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def args_profile(args: argparse.Namespace, **sections: dict):
    """The profile a command runs on: `--profile` with its `--set` overrides, then the command's own options
    (`sections`: {section: {key: value}}, a None value left out)."""
    from jf_core.config import load_profile, parse_overrides

    overrides = parse_overrides(getattr(args, "set", None) or [])
    for section, values in sections.items():
        overrides.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    return load_profile(args.profile, **overrides)


def bench_prompts(args: argparse.Namespace):
    """The model's directory, its profile and tokenizer, and `--num-prompts` of the profile's evaluation prompts (the
    held-out questions' confirmation half: these benches report) in the model's prompt format (`jf bench serve` and
    `jf bench vllm`)."""
    from jf_core.evaluation.benchmarks import load_benchmark
    from jf_core.models import load_model
    from jf_core.trajectory.prompts import PromptFormat

    profile = args_profile(args)
    path = model_path(args.model, profile)
    cfg = profile.evaluation
    _, tok = load_model(path, dtype="float32", device="cpu")
    items = load_benchmark(
        cfg.benchmark, cfg.source, limit=args.num_prompts, template=cfg.template, held_out_slice="confirmation"
    )
    fmt = PromptFormat.of(profile.prompts)
    return path, profile, tok, [fmt.render(item.prompt, tok) for item in items]


def seed_list(text: str) -> list[int]:
    """An argparse type for `--seeds 0,1,2`: distinct integers."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds needs distinct seeds, got {text!r}")
    return seeds
