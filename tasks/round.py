"""One Jacobi Forcing round, end to end and locally (no Prefect): model in -> trajectories (Ray pool) -> pack ->
train -> evaluate -> model out, over the stages of tasks/stages.py. Everything the round makes lives under its
directory (trajectories/, packed/, model/, report.json); finished stages are reused, never redone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from jf_core.config import Profile
from tasks.stages import (
    RoundPaths,
    round_dir,
    round_report,
    stage_evaluate,
    stage_pack,
    stage_train,
    stage_trajectories,
    stage_tune,
    write_json_atomic,
)


def run_round(
    profile: Profile,
    out: str | Path | None = None,
    *,
    model_in: str | None = None,
    base_eval: dict | None = None,
    trajectories_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """`out` defaults to the round's content-keyed directory under the profile's runs_dir. `trajectories_dir`
    shares one trajectory store between rounds with the same model and block size (the ablations)."""
    started = time.perf_counter()
    model_in = model_in or profile.model.resolve()
    out = Path(out) if out is not None else round_dir(profile, model_in)
    if (out / "report.json").is_file() and (out / "model" / "config.json").is_file():
        return json.loads((out / "report.json").read_text())
    paths = RoundPaths(out, Path(trajectories_dir) if trajectories_dir is not None else None)
    stages = {"trajectories": stage_trajectories(profile, model_in, paths, progress=progress)}
    stages["pack"] = stage_pack(profile, paths)
    stages["train"] = stage_train(profile, model_in, paths, progress=progress)
    stage_tune(profile, paths.model)
    base_eval = base_eval or stage_evaluate(profile, model_in)
    report = round_report(profile, model_in, paths, stages, base_eval, stage_evaluate(profile, str(paths.model)))
    report["round_seconds"] = time.perf_counter() - started
    write_json_atomic(out / "report.json", report)
    return report


def run_rounds(profile: Profile, out: str | Path, *, progress: bool = True) -> list[dict]:
    """Progressive rounds: each round regenerates trajectories with the previous round's model at its block size."""
    if not profile.rounds:
        raise ValueError(f"profile {profile.name!r} lists no rounds")
    reports, model_in, base_eval = [], None, None
    for i, spec in enumerate(profile.rounds):
        updates = {
            "trajectory": profile.trajectory.model_copy(
                update={"block_size": spec.block_size, "round_id": f"round-{i}"}
            )
        }
        updates["training"] = profile.training.model_copy(update=spec.training_overrides())
        round_profile = profile.model_copy(update=updates)
        report = run_round(
            round_profile,
            Path(out) / f"round-{i}-n{spec.block_size}",
            model_in=model_in,
            base_eval=base_eval,
            progress=progress,
        )
        reports.append(report)
        model_in = str(Path(out) / f"round-{i}-n{spec.block_size}" / "model")
        base_eval = report["base_eval"] if i == 0 else base_eval
    return reports
