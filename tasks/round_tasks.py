"""Prefect tasks of a round: thin wrappers over jf_core/round/ and the MLflow modules that pass paths and URIs, and
return the stages' result types (jf_core/round/results.py).

Whether a stage runs is decided in one place, `run_stage` (its `done.json` marker, and the markers it was made
from); these tasks never ask again. They are not cached by Prefect either (`NO_CACHE`): a cache keyed on anything
but the marker could serve a stage whose output is gone or stale, and the one thing Prefect's cache added, a state
that shows a finished stage was not run again, is kept: a reused stage's task run ends in a Completed state named
`Reused`, with where it was read from as its message. Retries are declared where a retry is safe: trajectories
resume by shard and training resumes from its last checkpoint. Registration is never retried (a retry could
register twice).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from jacobi_forcing.tasks import events, mlflow_runs, model_package, registry
from jacobi_forcing.tasks.gpu_slots import gpu_slots
from jacobi_forcing.tasks.run_logs import library_warnings_in_run_log
from jacobi_forcing.tasks.train_distributed import train_distributed
from jacobi_forcing.tasks.trajectories import generate_trajectories
from jf_core.config import Profile
from jf_core.evaluation.results import adapter_part
from jf_core.round.paths import RoundPaths
from jf_core.round.results import PackResult, Registration, TrainResult, TrajectoriesResult, TuneResult
from jf_core.round.stages import (
    stage_evaluate,
    stage_pack,
    stage_train,
    stage_trajectories,
    stage_tune,
    stage_tune_untrained,
    untrained_anchors,
)

if TYPE_CHECKING:
    from jf_core.evaluation.gate import Figures
    from jf_core.evaluation.results import Evaluation
    from jf_core.round.report import RoundReport, RoundSummary


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


def _pack_run_name() -> str:
    """The pack task's run name: what picks its noisy states (the schedule, or CLLM's uniform Jacobi states)."""
    from prefect.runtime import task_run

    return f"pack ({task_run.parameters['profile'].training.noise_kind} noise)"


def _stage_task(name: str, run_name, retries: int = 0):
    """A stage's task: named after what it does, its result persisted (for the UI and a retried flow), never served
    from Prefect's cache (the module docstring says why); retried only where a retry resumes (trajectories by
    shard, training from its checkpoint). Called, it returns the stage's result: a task that ends in a state of
    its own (`Reused`) hands its caller that state, so the call takes the value out of it (`.task` is the Prefect
    task itself)."""

    def wrap(fn):
        stage = task(
            name=name,
            task_run_name=run_name,
            retries=retries,
            retry_delay_seconds=10,
            persist_result=True,
            cache_policy=NO_CACHE,
        )(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return stage(*args, return_state=True, **kwargs).result()  # raises as the task did, after its retries

        call.task = stage
        return call

    return wrap


class Reuse:
    """A stage task's `on_reuse`: the reuse in the run's log, and the task run's final state named `Reused`."""

    def __init__(self) -> None:
        self.line: str | None = None

    def __call__(self, line: str) -> None:
        self.line = line
        get_run_logger().info(line)

    def state(self, result):
        """What the task returns: `result`, inside a state named Reused when the stage was not run again (the caller
        gets `result` either way)."""
        return result if self.line is None else Completed(data=result, name="Reused", message=self.line)


def train_chain(prof: Profile, model_in: str, paths: RoundPaths) -> tuple[TrajectoriesResult, PackResult, TrainResult]:
    """A round's training stages: trajectories -> pack -> train, each made from the one before (`run_stage`).
    Shared by `jf-round` and `jf-ablate`, whose runs are rounds without the tuner and the registry."""
    root = str(paths.root)
    traj = trajectories(prof, model_in, root)
    packed = pack(prof, root, traj)
    return traj, packed, train(prof, model_in, root, packed)


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
    logger = get_run_logger()
    with library_warnings_in_run_log():
        path = model_package.resolve_model(uri, profile)
    logger.info("starting model %s -> %s", uri, path)
    return path


@_stage_task("trajectories", "trajectories n={profile.trajectory.block_size}", retries=2)
def trajectories(profile: Profile, model_in: str, root: str) -> TrajectoriesResult | State:
    logger, reuse = get_run_logger(), Reuse()

    def collect(round_profile: Profile, out: Path) -> TrajectoriesResult:
        bar = ProgressArtifact(
            f"Jacobi trajectories of {model_in} at n={profile.trajectory.block_size} (shards)",
            say=logger.info,
            label="trajectory shards",
        )
        result = generate_trajectories(round_profile, out, progress=False, on_shard=bar)
        logger.info(
            "%d prompts -> %d block rows in %.0f s (%.0f tokens/s)",
            result.prompts,
            result.rows,
            result.seconds,
            result.tokens_per_second,
        )
        return result

    hold = partial(gpu_slots, profile, "trajectories")
    paths = RoundPaths(Path(root))
    return reuse.state(stage_trajectories(profile, model_in, paths, collect=collect, on_reuse=reuse, hold=hold))


@_stage_task("pack", _pack_run_name)
def pack(profile: Profile, root: str, trajectories: TrajectoriesResult) -> PackResult | State:
    reuse = Reuse()
    result = stage_pack(profile, RoundPaths(Path(root)), trajectories, on_reuse=reuse)
    if reuse.line is None:
        get_run_logger().info("packed %d examples of %d blocks", result.examples, result.blocks)
    return reuse.state(result)


@_stage_task("train", "train {profile.training.steps} steps", retries=1)
def train(profile: Profile, model_in: str, root: str, packed: PackResult) -> TrainResult | State:
    steps = profile.training.steps
    logger, reuse = get_run_logger(), Reuse()
    bar = ProgressArtifact(f"{profile.training.method_name} training, {steps} steps")
    on_log = step_logger("", steps, logger.info, bar)

    with library_warnings_in_run_log():
        result = stage_train(
            profile,
            model_in,
            RoundPaths(Path(root)),
            packed,
            progress=False,
            on_log=on_log,
            launch=train_distributed,
            on_reuse=reuse,
            hold=partial(gpu_slots, profile, "train"),
        )
    bar(steps, steps)
    if result.resumed_from_step and reuse.line is None:
        logger.warning(
            "training resumed from its checkpoint at step %d of %d (a previous attempt died)",
            result.resumed_from_step,
            steps,
        )
    return reuse.state(result)


@_stage_task("tune", "autotune decode config")
def tune(profile: Profile, root: str, trained: TrainResult) -> TuneResult | State | None:
    logger, reuse = get_run_logger(), Reuse()
    result = stage_tune(profile, RoundPaths(Path(root)).model, trained, progress=logger.info, on_reuse=reuse)
    if result is not None and reuse.line is None:
        logger.info("decode config: %s", result.best.describe())
    return reuse.state(result)


@_stage_task("tune-untrained", "autotune the untrained input model")
def tune_untrained(profile: Profile, model_in: str) -> TuneResult | State | None:
    """The same tune on the round's input model: its anchor rows' decode config (what our decoder gives a user who
    does not train)."""
    logger, reuse = get_run_logger(), Reuse()
    result = stage_tune_untrained(profile, model_in, lambda line: logger.info("untrained: %s", line), on_reuse=reuse)
    if result is not None and reuse.line is None:
        logger.info("untrained decode config: %s", result.best.describe())
    return reuse.state(result)


@_stage_task("evaluate", "evaluate {label}")
def evaluate(
    profile: Profile, model_path: str, label: str, untrained_from: str | None = None, tuning: TuneResult | None = None
) -> Evaluation | State:
    """`untrained_from`: the input model whose untrained anchors join the evaluation, decoded with `tuning` (its
    untrained tune) where the tune ran."""
    logger, reuse = get_run_logger(), Reuse()
    anchors = untrained_anchors(profile, untrained_from, tuning) if untrained_from else None
    result = stage_evaluate(
        profile,
        model_path,
        untrained=anchors,
        progress=lambda line: logger.info("%s: %s", label, line),  # a real model on a CPU evaluates for minutes
        on_reuse=reuse,
        hold=partial(gpu_slots, profile, "evaluate"),
    )
    tpf = ", ".join(f"n={n}: {v:.2f}" for n, v in result.tpf.items())
    logger.info("%s: accuracy %.3f, TPF %s", label, result.accuracy, tpf)
    if (best := result.best_untrained) is not None:
        logger.info(
            "%s: %s (that anchor %.2fx AR)", label, result.versus().line(result.timing_spread), best.speedup_vs_ar
        )
    if line := adapter_part(result.speedup_vs_no_adapter, result.adapter_left_out):
        logger.info("%s: %s", label, line.rstrip())
    return reuse.state(result)


@task(
    name="input-evaluation",
    task_run_name="the input model, from the trained model's evaluation",
    cache_policy=NO_CACHE,
)
def input_evaluation(evaluation: Evaluation, model_in: str) -> Evaluation | None:
    """The input model's evaluation read from the trained model's untrained rows (`Evaluation.input_evaluation`), or
    None where they do not make one: the flow then evaluates the input model in a pass of its own."""
    found = evaluation.input_evaluation()
    if found is None:
        return None
    tpf = ", ".join(f"n={n}: {v:.2f}" for n, v in found.tpf.items())
    get_run_logger().info(
        "input model: accuracy %.3f, TPF %s (its rows in the trained model's evaluation)", found.accuracy, tpf
    )
    return found.model_copy(update={"model": model_in})


@task(name="champion-figures", task_run_name="the champion on this evaluation")
def champion_figures(profile: Profile, eval_key: str) -> Figures | None:
    """The champion's gate figures on this round's evaluation: recorded on its version when it was measured alike,
    else measured now (a champion from before the gate recorded figures, or an evaluation config that changed)."""
    from jf_core.evaluation.gate import Figures

    client, _ = mlflow_runs.connect(profile)
    current, figures = registry.champion_figures(client, profile.model_name, eval_key)
    if figures is not None or current is None:
        return figures
    get_run_logger().info("champion version %s has no figures on this evaluation: evaluating it", current.version)
    path = model_package.resolve_model(f"models:/{profile.model_name}/{current.version}", profile)
    evaluation = stage_evaluate(profile, path, hold=partial(gpu_slots, profile, "evaluate"))
    return Figures.of(evaluation, eval_key)


@task(name="register", task_run_name="log and register {profile.name}")
def register(
    profile: Profile,
    run_id: str,
    report: RoundReport,
    history: list[RoundSummary],
    champion: Figures | None = None,
) -> Registration:
    from jf_core.round.figures import round_figures

    client, _ = mlflow_runs.connect(profile)
    mlflow_runs.log_round(client, run_id, report, round_figures(report, history))
    done = registry.register(client, run_id, profile, report, champion)
    logger = get_run_logger()
    logger.info(
        "registered %s version %s: gate %s (%s)",
        done.model_name,
        done.version,
        "passed -> champion" if done.gate_passed else "failed, champion unchanged",
        "; ".join(done.gate_reasons),
    )
    if done.champion_moved:  # the champion benchmark deployment starts on this
        events.champion_changed(done.model_name, done.version)
        logger.info("event %s sent for %s version %s", events.CHAMPION_CHANGED, done.model_name, done.version)
    return done
