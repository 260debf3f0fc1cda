"""The small round of the tests that run a whole round through a user's entry point (the README's main job with
`--set`, the stack e2e's deployment overrides): their point is the command, the orchestration and the console, not
the round's figures; the full-size round is the README's main job as a user runs it."""

from __future__ import annotations

# The autotune keeps multi-block, recycling and adaptive width in its grid: 8 candidates at n = 16 on 4 prompts once,
# not the profile's 48 on 24 prompts twice (7 minutes a round).
SMALL_ROUND = {
    "prompts": {"limit": 48},
    "training": {"steps": 40},
    "evaluation": {
        "num_prompts": 12,
        "speed_prompts": 4,
        # One timed run a batch and no block size to choose: the evaluations were a third of a round's CPU time
        # (py-spy on the README's main job at these sizes, 2026-12-05).
        "min_timed_seconds": 0,
        "repeats": 1,
        "block_sizes": [16],
        # 40 steps need not beat the base's untrained decoding: its anchors off, and with them the gate's check
        # (tests/jf_core/round/test_stages.py and tests/flows/test_round.py run them).
        "untrained": False,
        "tune": {  # merged into the profile's tune section: only what differs
            "prompts": 4,
            "repeats": 1,
            "grid": {"block_size": [16], "seed_drafts": [False]},
            "crossover_batch_sizes": [1, 4],
        },
    },
}
# 40 steps cost accuracy (the full round does not) and may leave the tuned model at AR's speed, or at its untrained
# base's, timed on 4 prompts (a spread beyond the default floors): a gate that passes such a round, for the tests
# whose later steps need a champion.
LENIENT_GATE = {"max_accuracy_drop": 1.0, "max_base_accuracy_drop": 1.0, "min_speedup_vs_ar": 0.05}


def as_sets(overrides: dict, prefix: str = "") -> dict[str, object]:
    """Nested overrides as the dotted keys of `jf run --set KEY=VALUE`, one per leaf (a list is a leaf)."""
    flat: dict[str, object] = {}
    for key, value in overrides.items():
        if isinstance(value, dict):
            flat |= as_sets(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
