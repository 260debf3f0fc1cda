"""Prefect tasks of a round: thin wrappers over jf_core/round/ and the MLflow modules that pass paths and URIs.

Reuse is two-layered. Every stage skips work whose `done.json` marker exists (so a retry or re-run never redoes a
finished stage), and the tasks are cached by their content-addressed output directory, so Prefect shows a finished
stage as `Cached` without entering it; `cached()` refreshes the record of a stage whose output is gone.
Retries are declared where a retry is safe: trajectories resume by shard and training resumes from its last
checkpoint. Registration is never retried (a retry could register twice).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from jacobi_forcing.tasks import events, mlflow_runs, model_package, registry
from jacobi_forcing.tasks.gpu_slots import gpu_slots
from jacobi_forcing.tasks.run_logs import library_warnings_in_run_log
from jacobi_forcing.tasks.train_distributed import train_distributed
from jacobi_forcing.tasks.trajectories import stage_trajectories
from jf_core.config import Profile
from jf_core.model_dir import DONE
from jf_core.round.paths import EVAL_FORMAT, RoundPaths, eval_path, finished
from jf_core.round.stages import stage_evaluate, stage_pack, stage_train, stage_tune

if TYPE_CHECKING:
    from jf_core.evaluation.results import Evaluation
    from jf_core.round.report import RoundReport


class ProgressArtifact:
    """A Prefect progress artifact fed by `(done, total)` callbacks, updated at most every `every` seconds.

    With `say` (the run logger's `info`), also a line in the run's log, so in the terminal and the Prefect UI alike:
    how far, the time so far and an estimate of what is left, at most every `say_every` seconds and at the end. A
    real model on a CPU spends tens of minutes in one stage; a bar in the artifacts tab alone left the terminal
    silent. The estimate counts only the work done in this attempt (a resumed stage starts from its committed
    shards)."""

    def __init__(
        self,
        description: str,
        every: float = 2.0,
        *,
        say: Callable[[str], None] | None = None,
        label: str | None = None,
        say_every: float = 30.0,
    ) -> None:
        self.id = create_progress_artifact(0.0, description=description)
        self.label, self.every, self.last = label or description, every, 0.0
        self.say, self.say_every, self.said = say, say_every, time.monotonic()
        self.started, self.first = time.monotonic(), None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self.last >= self.every:
            self.last = now
            update_progress_artifact(self.id, 100.0 * done / max(1, total))
        if self.first is None:
            self.first = done - 1  # the first call reports one unit of this attempt
        if self.say is not None and (done >= total or now - self.said >= self.say_every):
            self.said = now
            self.say(progress_line(self.label, done, total, now - self.started, done - self.first))


def progress_line(what: str, done: int, total: int, elapsed: float, done_here: int) -> str:
    """`what: 8/25, 190 s, about 400 s left`; the pace is that of the `done_here` units this attempt did."""
    line = f"{what}: {done}/{total}, {elapsed:.0f} s"
    if done_here > 0 and done < total:
        line += f", about {elapsed / done_here * (total - done):.0f} s left"
    return line


def _cache_on(stage: str):
    """Cache key of a stage: its directory, which is content-addressed (the round directory is keyed by the input
    model and every config that shapes the stage's output). Whether the cached record may be trusted is decided at
    the call site (`cached`): a stage whose output is gone is refreshed, never served from the cache."""

    def key(_ctx, params: dict) -> str:
        return hashlib.sha256(f"{stage}:{params['root']}".encode()).hexdigest()

    return key


def _pack_run_name() -> str:
    """The pack task's run name: what picks its noisy states (the schedule, or CLLM's uniform Jacobi states)."""
    from prefect.runtime import task_run

    return f"pack ({task_run.parameters['profile'].training.noise_kind} noise)"


def _stage_task(stage: str, run_name, retries: int = 0):
    """A stage's task: named after what it does, result persisted, cached by its output directory; retried only
    where a retry resumes (trajectories by shard, training from its checkpoint)."""
    return task(
        name={"packed": "pack", "model": "train"}.get(stage, stage),
        task_run_name=run_name,
        retries=retries,
        retry_delay_seconds=10,
        persist_result=True,
        cache_key_fn=_cache_on(stage),
    )


def cached(task_fn, output: Path, *args, **kwargs):
    """Call a stage task, serving Prefect's cached record only while the stage's output is really on disk."""
    done = (output / DONE).is_file() or (output.is_file() and output.suffix == ".json")
    return task_fn.with_options(refresh_cache=not done)(*args, **kwargs)


def train_chain(prof: Profile, model_in: str, paths: RoundPaths) -> tuple[dict, dict, dict]:
    """A round's training stages, each reused while its output is on disk: trajectories -> pack -> train. Shared by
    `jf-round` and `jf-ablate`, whose runs are rounds without the tuner and the registry."""
    root = str(paths.root)
    traj = cached(trajectories, paths.trajectories, prof, model_in, root)
    packed = cached(pack, paths.packed, prof, root, wait_for=[traj])
    trained = cached(train, paths.model, prof, model_in, root, wait_for=[packed])
    return traj, packed, trained


def _reused(root: str, stage: str, what: str) -> dict | None:
    """The finished stage's result when its marker exists (logged to the run), else None."""
    out = getattr(RoundPaths(Path(root)), stage)
    done = finished(out)
    if done is not None:
        get_run_logger().info("reusing finished %s at %s", what, out)
    return done


def flow_run_state(flow_run_id: str) -> str | None:
    """A flow run's state type on the Prefect server (None: no such run)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return None
    return run.state.type.value if run.state is not None else None


def step_logger(what: str, steps: int, say: Callable[[str], None], bar: ProgressArtifact | None = None):
    """A training's `on_log(step, row)` for a flow's log: twenty lines over the run (and every TPF probe, whose
    steps need not fall on those twenty), `what: step 150/3000: loss ...`; `bar` gets every logged step."""

    said = [-steps]  # the step of the last line

    def on_log(step: int, row: dict) -> None:
        if bar is not None:
            bar(step + 1, steps)
        if step - said[0] >= max(1, steps // 20) or any(k.startswith("probe_") for k in row):
            said[0] = step
            say(f"{what}step {step}/{steps}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k != "step"))

    return on_log


@task(name="resolve-model", task_run_name="resolve model {uri}", retries=2, retry_delay_seconds=5)
def resolve_model(uri: str, profile: Profile) -> str:
    from jf_core.toy.bootstrap import BootstrapConfig

    logger = get_run_logger()
    # Used only when the embedded model is not cached yet: its bootstrap (minutes on a CPU) then says how far it is
    # in the run's log, where a terminal bar is seen by nobody.
    steps, trained = BootstrapConfig().train.steps, []
    say = step_logger("bootstrapping the embedded model (first run only): ", steps, logger.info)

    def on_log(step: int, row: dict) -> None:
        trained.append(step)
        say(step, row)

    with library_warnings_in_run_log():
        path = model_package.resolve_model(uri, profile, on_log=on_log)
    if trained:
        done = json.loads((Path(path) / "bootstrap.json").read_text())
        logger.info("bootstrapped the embedded model: accuracy %.3f, %.0f s", done["accuracy"], done["total_seconds"])
    logger.info("starting model %s -> %s", uri, path)
    return path


@_stage_task("trajectories", "trajectories n={profile.trajectory.block_size}", retries=2)
def trajectories(profile: Profile, model_in: str, root: str) -> dict:
    if (done := _reused(root, "trajectories", "trajectories")) is not None:
        return done
    paths = RoundPaths(Path(root))
    bar = ProgressArtifact(
        f"Jacobi trajectories of {model_in} at n={profile.trajectory.block_size} (shards)",
        say=get_run_logger().info,
        label="trajectory shards",
    )
    with gpu_slots(profile, "trajectories"):
        result = stage_trajectories(profile, model_in, paths, progress=False, on_shard=bar)
    get_run_logger().info(
        "%d prompts -> %d block rows in %.0f s (%.0f tokens/s)",
        result["prompts"],
        result["rows"],
        result["seconds"],
        result["tokens_per_second"],
    )
    return result


@_stage_task("packed", _pack_run_name)
def pack(profile: Profile, root: str) -> dict:
    if (done := _reused(root, "packed", "packed examples")) is not None:
        return done
    result = stage_pack(profile, RoundPaths(Path(root)))
    get_run_logger().info("packed %d examples of %d blocks", result["examples"], result["blocks"])
    return result


@_stage_task("model", "train {profile.training.steps} steps", retries=1)
def train(profile: Profile, model_in: str, root: str) -> dict:
    if (done := _reused(root, "model", "trained model")) is not None:
        return done
    steps = profile.training.steps
    bar = ProgressArtifact(f"{profile.training.method_name} training, {steps} steps")
    logger = get_run_logger()
    on_log = step_logger("", steps, logger.info, bar)
    with gpu_slots(profile, "train"), library_warnings_in_run_log():
        paths = RoundPaths(Path(root))
        result = stage_train(profile, model_in, paths, progress=False, on_log=on_log, launch=train_distributed)
    bar(steps, steps)
    if result.get("resumed_from_step"):
        logger.warning(
            "training resumed from its checkpoint at step %d of %d (a previous attempt died)",
            result["resumed_from_step"],
            steps,
        )
    return result


@task(name="tune", task_run_name="autotune decode config", persist_result=True)
def tune(profile: Profile, root: str) -> dict | None:
    model_dir = RoundPaths(Path(root)).model
    result = stage_tune(profile, model_dir, progress=get_run_logger().info)
    if result is not None:
        b = result["best"]
        get_run_logger().info(
            "decode config: n=%d K=%d pool=%d r=%.2f",
            b["block_size"],
            b["num_blocks"],
            b["pool_size"],
            b["spawn_ratio"],
        )
    return result


def _eval_key(_ctx, params: dict) -> str:
    # The format is part of the key: a record cached by a version that returned another shape is never served.
    where = eval_path(params["profile"], params["model_path"])
    return hashlib.sha256(f"{EVAL_FORMAT}:{where}".encode()).hexdigest()


@task(name="evaluate", task_run_name="evaluate {label}", persist_result=True, cache_key_fn=_eval_key)
def evaluate(profile: Profile, model_path: str, label: str) -> Evaluation:
    logger = get_run_logger()
    with gpu_slots(profile, "evaluate"):
        # Its progress in the flow run's log: a real model on a CPU evaluates for tens of minutes.
        result = stage_evaluate(profile, model_path, progress=lambda line: logger.info("%s: %s", label, line))
    tpf = ", ".join(f"n={n}: {v:.2f}" for n, v in result.tpf.items())
    logger.info("%s: accuracy %.3f, TPF %s", label, result.accuracy, tpf)
    return result


@task(name="champion-figures", task_run_name="the champion on this evaluation")
def champion_figures(profile: Profile, eval_key: str) -> dict | None:
    """The champion's gate figures on this round's evaluation: recorded on its version when it was measured alike,
    else measured now (a champion from before the gate recorded figures, or an evaluation config that changed)."""
    from jf_core.evaluation.gate import Figures

    client, _ = mlflow_runs.connect(profile)
    current, figures = registry.champion_figures(client, profile.model_name, eval_key)
    if figures is not None:
        return asdict(figures)
    if current is None:
        return None
    get_run_logger().info("champion version %s has no figures on this evaluation: evaluating it", current.version)
    path = model_package.resolve_model(f"models:/{profile.model_name}/{current.version}", profile)
    with gpu_slots(profile, "evaluate"):
        return asdict(Figures.of(stage_evaluate(profile, path), eval_key))


@task(name="register", task_run_name="log and register {profile.name}")
def register(
    profile: Profile, run_id: str, report: RoundReport, history: list[dict], champion: dict | None = None
) -> dict:
    from jf_core.evaluation.gate import Figures
    from jf_core.evaluation.plots import round_figures

    client, _ = mlflow_runs.connect(profile)
    mlflow_runs.log_round(client, run_id, report, round_figures(report, history))
    champion_at = None if champion is None else Figures(**champion)
    version, decision, champion_moved = registry.register(client, run_id, profile, report, champion_at)
    logger = get_run_logger()
    logger.info(
        "registered %s version %s: gate %s (%s)",
        profile.model_name,
        version,
        "passed -> champion" if decision.passed else "failed, champion unchanged",
        "; ".join(decision.reasons),
    )
    if champion_moved:  # the champion benchmark deployment starts on this
        events.champion_changed(profile.model_name, version)
        logger.info("event %s sent for %s version %s", events.CHAMPION_CHANGED, profile.model_name, version)
    return {
        "version": version,
        "gate_passed": decision.passed,
        "gate_reasons": decision.reasons,
        "gate_checks": [asdict(c) for c in decision.checks],
    }
