"""What a variant of an experiment is: overrides of a profile's sections (`SECTIONS`; `from`: an earlier variant's
trained model to start from), merged field by field, and a seed (`training.seed`: batch order and the random
schedule's draws). The in-process experiment (run.py) and the `jf-ablate` flow (ablation.py) build their runs' profiles
here, so "a variant" and "a seed" mean one thing in both."""

from __future__ import annotations

from collections.abc import Sequence

from jf_core.config import Profile, merge_overrides

# What a variant may change: the model it trains and the data it trains on (its questions, e.g. their answers for
# `trajectory.kind: text`, through `prompts`); the model it starts from, the measurement and the machine are the
# experiment's.
SECTIONS = ("training", "trajectory", "prompts")
# A variant's keys: its sections, and `from`, an earlier variant whose trained model it starts from (the seed's
# progressive rounds: its trajectories collected by that model, its training going on from it).
VARIANT_KEYS = (*SECTIONS, "from")


def sectioned(overrides: dict) -> dict:
    """A variant's overrides by section (and `from`): training's fields alone are the shorthand (`{"lr": 1e-3}`)."""
    return overrides if overrides and set(overrides) <= set(VARIANT_KEYS) else {"training": overrides}


def merge(*layers: dict[str, dict]) -> dict[str, dict]:
    """Override dicts merged field by field (nested sections too), later layers winning."""
    out: dict[str, dict] = {}
    for layer in layers:
        merge_overrides(out, layer or {})
    return out


def run_overrides(common: dict[str, dict], variant: dict[str, dict], seed: int | None) -> dict[str, dict]:
    """One (variant, seed) run's overrides: the common ones, the variant's, then the seed (None: the profile's)."""
    return merge(common, variant, {} if seed is None else {"training": {"seed": seed}})


def seeded(variants: dict[str, dict], seeds: Sequence[int] | None) -> dict[str, dict]:
    """Each variant once per seed, named `NAME (seed S)`, its `from` naming the same seed's run of that variant;
    `seeds` None: the variants as they are."""
    if not seeds:
        return variants
    out = {}
    for seed in seeds:
        for name, overrides in variants.items():
            run = run_overrides({}, {k: v for k, v in overrides.items() if k != "from"}, seed)
            if "from" in overrides:
                run["from"] = f"{overrides['from']} (seed {seed})"
            out[f"{name} (seed {seed})"] = run
    return out


def variant_profile(profile: Profile, overrides: dict) -> Profile:
    """The profile with a variant's overrides ({section: {field: value}}, `SECTIONS` only), validated: a bad key or
    value is refused by name."""
    unknown = sorted(set(overrides) - set(SECTIONS))
    if unknown:
        raise ValueError(f"a variant overrides {SECTIONS} only, not {unknown}")
    return Profile.model_validate(merge_overrides(profile.model_dump(), overrides))
