"""What each stage of a round returns, as types, and the one rule that decides whether a stage runs.

A finished stage leaves a `done.json` marker (written last, atomically) holding its result; `run_stage` reads it
back as the stage's type, or runs the stage and writes it. A marker carries a `stamp` (new each time the stage
runs) and the stamps of the markers it was made from (`inputs`): a stage is reused only while its marker exists,
parses as its type, and was made from the markers now upstream of it. So a re-run reuses every stage, and a stage
made again (its marker removed, or written by another version of this code) makes every stage after it run again,
as `make` would. Nothing above this module asks whether a stage is done: the Prefect tasks, the flows and the CLI
take what `run_stage` returns.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jf_core.atomic import write_json_atomic
from jf_core.decoding import JFDecodeConfig
from jf_core.evaluation.gate import Check
from jf_core.evaluation.tune import TuneTrial
from jf_core.model_dir import DONE, ServingPrior
from jf_core.training.noise import NoiseProfile
from jf_core.training.trainer import TrainSummary

log = logging.getLogger("jf.stages")


def _stamp() -> str:
    return uuid.uuid4().hex[:16]


class StageResult(BaseModel):
    """A stage's result as its marker holds it: the stage's fields, its `stamp` and its `inputs` (the stamps of the
    markers it was made from, by stage name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stamp: str = Field(default_factory=_stamp)
    inputs: dict[str, str] = {}
    seconds: float = 0.0  # wall time of the stage's work when it ran (a reused stage keeps its run's)


class TrajectoriesResult(StageResult):
    """The trajectory stage (Jacobi decoding on a Ray actor pool or in one fresh process, resumed by shard)."""

    out: str
    prompts: int
    skipped: dict[str, int]
    shards: int
    shards_generated: int
    rows: int
    new_tokens_generated: int
    # `seconds`: end to end (prompts, Ray and actor start-up, generation); this: generation only, from all actors
    # ready to the last shard committed
    pool_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generation throughput of the actor pool (start-up excluded)."""
        return self.new_tokens_generated / self.pool_seconds if self.pool_seconds else 0.0


class PackResult(StageResult):
    """The packing stage: examples written, blocks they hold, blocks dropped (by reason), the noise it picked."""

    examples: int
    blocks: int
    dropped_blocks: dict[str, int]
    noise: NoiseProfile


class TrainResult(TrainSummary, StageResult):
    """The training stage: the run's summary (jf_core/training/trainer.py), as the model directory's marker."""


class TuneResult(StageResult):
    """The tune stage: the chosen decode config (also in the model's config.json), every trial, and the crossover."""

    best: JFDecodeConfig
    calibration_prompts: int
    trials: list[TuneTrial]
    serving: ServingPrior | None = None  # the crossover, also stored in the model's block

    @property
    def best_trial(self) -> TuneTrial:
        return next(t for t in self.trials if t.config == self.best)


class Registration(BaseModel):
    """What registering a round did (tasks/registry.py): the version (new, or the one a re-run of the same round
    registered before), the gate's verdict with its reasons and checks (a reused registration carries its recorded
    reasons only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str
    version: str
    gate_passed: bool
    gate_reasons: list[str]
    gate_checks: list[Check] = []
    # this call set the `champion` alias: a passing new version, or a re-run finishing a killed registration's
    # promotion (what the champion-changed event is sent on)
    champion_moved: bool


R = TypeVar("R", bound=BaseModel)


def read_marker(marker: Path, result_type: type[R], inputs: Mapping[str, str] | None = None) -> R | None:
    """The stage result `marker` holds, or None when the stage must run: no marker, one that does not parse as
    `result_type` (written by another version: said in the log), or one made from other inputs than `inputs`."""
    if not marker.is_file():
        return None
    try:
        done = result_type.model_validate_json(marker.read_text())
    except ValidationError as e:
        log.info("running again: %s was written by another version (%d fields differ)", marker, e.error_count())
        return None
    if inputs is not None and isinstance(done, StageResult) and done.inputs != dict(inputs):
        log.info("running again: %s was made from other inputs than the stages before it now hold", marker)
        return None
    return done


def run_stage(
    marker: Path,
    result_type: type[R],
    work: Callable[[], R],
    *,
    what: str,
    inputs: Mapping[str, StageResult] | None = None,
    reuse: bool = True,
    on_reuse: Callable[[str], None] | None = None,
    hold: Callable[[], AbstractContextManager] | None = None,
) -> R:
    """The stage's result: read back from `marker` when the stage is done (see the module docstring), else
    `work()`'s, written to `marker` (atomically, last) with a new stamp and the stamps of `inputs`. `reuse=False`
    runs it regardless (`jf eval`, `jf tune`). `on_reuse(line)` hears that the stage was reused, and where from
    (default: this module's log); a Prefect task shows it as the run's state. `hold()` is entered around the work
    only (the orchestration's GPU slots: a reused stage waits for no GPU)."""
    stamps = {name: r.stamp for name, r in (inputs or {}).items()}
    if reuse and (done := read_marker(marker, result_type, stamps)) is not None:
        (on_reuse or log.info)(f"reusing {what} at {marker.parent if marker.name == DONE else marker}")
        return done
    with hold() if hold is not None else nullcontext():
        started = time.perf_counter()
        result = work()
    if isinstance(result, StageResult):
        elapsed = time.perf_counter() - started
        result = result.model_copy(update={"stamp": _stamp(), "inputs": stamps, "seconds": elapsed})
    write_json_atomic(marker, result.model_dump(mode="json"))
    return result
