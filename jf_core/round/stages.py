"""The stages of a round as plain functions over paths: trajectories -> pack -> train -> tune -> evaluate.

Each returns its result type (jf_core/round/results.py) through `run_stage`, the one rule that decides whether a
stage runs: a finished stage's `done.json` marker is read back as its type, so a re-run, a retried task or a
resumed flow reuses every finished stage, and a stage made again makes the ones after it run again. The Prefect
flow (flows/round.py) calls these through thin tasks (tasks/round_tasks.py), and `jf tune` and `jf eval` call the
same functions. What needs a cluster is passed in: the Ray actor pool that collects trajectories (`collect`,
tasks/trajectories.py) and the Ray Train launcher (`launch`, tasks/train_distributed.py). Where the round's
directories lie is paths.py.

Why one module of 360 lines: the stages are read in the order a round runs them, each beside the helpers only it
uses, all through the one `run_stage` rule; split up, a reader would follow a round across files.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from jf_core.config import Profile
from jf_core.model_dir import DECODE_TUNING, DONE
from jf_core.round.fresh import timed_work
from jf_core.round.paths import RoundPaths, eval_path, model_identity, untrained_tune_path
from jf_core.round.results import (
    PackResult,
    TrainResult,
    TrainSummary,
    TrajectoriesResult,
    TuneResult,
    run_stage,
)

if TYPE_CHECKING:
    from jf_core.evaluation.results import Evaluation

log = logging.getLogger("jf.stages")

Say = Callable[[str], None]
Hold = Callable[[], AbstractContextManager]  # what a stage's work holds while it runs (`run_stage`)


def stage_trajectories(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    *,
    collect: Callable[[Profile, Path], TrajectoriesResult],
    on_reuse: Say | None = None,
    hold: Hold | None = None,
) -> TrajectoriesResult:
    """Jacobi trajectories of `model_in` over the profile's prompts: `collect(profile, out)` runs the actor pool (it
    resumes by shard, so a stage run again redoes only the shards it lacks). `hold`: see `run_stage`."""
    round_profile = profile.model_copy(update={"model": profile.model.model_copy(update={"path": model_in})})
    return run_stage(
        paths.trajectories / DONE,
        TrajectoriesResult,
        lambda: collect(round_profile, paths.trajectories),
        what="trajectories",
        on_reuse=on_reuse,
        hold=hold,
    )


def stage_pack(
    profile: Profile, paths: RoundPaths, trajectories: TrajectoriesResult, *, on_reuse: Say | None = None
) -> PackResult:
    """`[prompt][noisy_0][clean_0]...` examples under the profile's noise schedule -> packed/examples.parquet."""
    return run_stage(
        paths.packed / DONE,
        PackResult,
        lambda: _pack(profile, paths),
        what="packed examples",
        inputs={"trajectories": trajectories},
        on_reuse=on_reuse,
    )


def pack_to(profile: Profile, records: list[dict], out: Path, source: str = "the trajectories"):
    """`records` packed as the profile's training packs them (its noise schedule, max length) and written to `out`
    atomically: (the packed examples, the packing's stats). Packing nothing is an error naming `source`."""
    import pyarrow as pa

    from jf_core.atomic import write_parquet_atomic
    from jf_core.training.noise import NoiseSchedule
    from jf_core.training.packing import pack_records

    t = profile.training
    packed, stats = pack_records(records, NoiseSchedule.of(t), t.max_length, t.noisy_copies, t.noisy_width)
    if not packed:
        raise ValueError(f"packing {source} produced no examples (dropped: {dict(stats.dropped_blocks)})")
    # Further noisy copies are drawn per visit, never stored.
    rows = [{k: v for k, v in asdict(e).items() if k != "extra_noisy"} for e in packed]
    write_parquet_atomic(out, pa.Table.from_pylist(rows))
    return packed, stats


def _pack(profile: Profile, paths: RoundPaths) -> PackResult:
    from jf_core.training.noise import NoiseSchedule, ratio_profile
    from jf_core.trajectory.store import TrajectoryStore

    records = TrajectoryStore(paths.trajectories).read().to_pylist()
    _, stats = pack_to(profile, records, paths.examples, str(paths.trajectories))
    schedule = NoiseSchedule.of(profile.training)
    return PackResult(
        examples=stats.examples,
        blocks=stats.blocks,
        dropped_blocks=dict(stats.dropped_blocks),
        noise=ratio_profile(records, schedule),  # what the schedule made of them
    )


def stage_train(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    packed: PackResult,
    *,
    progress: bool = True,
    on_log: Callable[[int, dict], None] | None = None,
    launch: Callable[..., TrainSummary] | None = None,
    on_reuse: Say | None = None,
    hold: Hold | None = None,
) -> TrainResult:
    """Jacobi Forcing training from `model_in` on the packed examples -> model/ (safetensors + tokenizer, in the
    model's dtype), through the one driver (jf_core/round/training.py). `training.strategy` single runs it here;
    ddp and fsdp2 run it on workers that `launch(profile, paths, model_in, on_log=...)` starts (the orchestration
    layer's Ray Train launcher, tasks/train_distributed.py).

    Checkpoints (weights + optimizer) every `training.checkpoint_every` steps let a retried task or a restarted
    worker resume where it died; they are removed once the model directory is complete. `hold`: see `run_stage`."""
    if profile.training.strategy != "single" and launch is None:
        raise ValueError(
            f"training.strategy {profile.training.strategy!r} trains on several workers: run the round through "
            "its flow (`jf run`), which starts them, or set training.strategy: single"
        )

    def work() -> TrainResult:
        if profile.training.strategy != "single":
            summary = launch(profile, paths, model_in, on_log=on_log)
        else:
            summary = _train_here(profile, model_in, paths, progress=progress, on_log=on_log)
        if profile.training.draft_corpus:
            keep_draft_corpus(paths)
        shutil.rmtree(paths.checkpoints, ignore_errors=True)
        return TrainResult(**summary.model_dump())

    return run_stage(
        paths.model / DONE,
        TrainResult,
        work,
        what="trained model",
        inputs={"packed": packed},
        on_reuse=on_reuse,
        hold=hold,
    )


def keep_draft_corpus(paths: RoundPaths) -> None:
    """The round's greedy answers beside its model, for suffix drafts: the trained model decodes text like its
    trajectories' (written before the stage's marker, so a stage that died before it writes it again)."""
    from jf_core.decoding.proposers.suffix import save_corpus
    from jf_core.trajectory.store import TrajectoryStore

    save_corpus(TrajectoryStore(paths.trajectories).answers(), paths.model)


def _train_here(profile: Profile, model_in: str, paths: RoundPaths, *, progress: bool, on_log) -> TrainSummary:
    from jf_core.models import resolve_device
    from jf_core.round.training import train_round
    from jf_core.threads import ThreadGovernor

    device = resolve_device(profile.model.device)
    # On CPU one thread count for the whole run, so the model does not follow the machine's load (jf_core/threads.py);
    # on GPU the count hardly matters and is left alone.
    c = profile.compute
    threads = ThreadGovernor.for_training(c.threads, c.adaptive_threads) if device.type == "cpu" else None
    summary = train_round(
        profile,
        model_in,
        paths.examples,
        paths.checkpoints,
        paths.model,
        device=device,
        threads=threads,
        progress=progress,
        on_log=on_log,
    )
    if summary.resumed_from_step:
        log.info("training resumed from its checkpoint at step %d of %d", summary.resumed_from_step, summary.steps)
    return summary


def stage_tune(
    profile: Profile,
    model_dir: Path,
    trained: TrainResult | None = None,
    progress: Say | None = None,
    *,
    reuse: bool = True,
    on_trial: Callable[[int, int, object], None] | None = None,
    on_reuse: Say | None = None,
) -> TuneResult | None:
    """Autotune the model's decode config on calibration prompts (`evaluation.tune`), measure AR's crossover batch
    size, and write both into the `jacobi_forcing` block of the model's config.json (when enabled); the stage's
    marker is the model directory's decode_tuning.json, made from `trained` (the training stage's result; None:
    a model from elsewhere, `jf tune`). `progress(line)` hears how far it is (a grid of configurations takes
    minutes even on the toy); `on_trial(i, total, trial)` gets each configuration's figures once all are measured.
    `reuse=False` tunes again a model tuned before (`jf tune`)."""
    if not profile.evaluation.tune.enabled:
        return None
    model_dir = Path(model_dir)
    return run_stage(
        model_dir / DECODE_TUNING,
        TuneResult,
        lambda: timed_work(profile, _tune, profile, model_dir, say=progress or log.info, on_trial=on_trial),
        what="the tuned decode config",
        inputs={"model": trained} if trained is not None else None,
        reuse=reuse,
        on_reuse=on_reuse,
    )


def _tune(profile: Profile, model_dir: Path, say: Say, on_trial) -> TuneResult:
    from jf_core.model_dir import save_decode_config, update_block
    from jf_core.models import load_model

    model, tok = load_model(str(model_dir), **profile.model.decode_kwargs())
    (model_dir / DECODE_TUNING).unlink(missing_ok=True)  # the old report no longer describes the stored config
    result = tune_model(profile, model, tok, say, on_trial)
    # Stored at the evaluation's length (what a consumer decodes by default), whatever length it was tuned at.
    save_decode_config(model_dir, replace(result.best, max_new_tokens=profile.evaluation.max_new_tokens))
    if result.serving is not None:
        update_block(model_dir, **result.serving.block())
    return result


def tune_model(profile: Profile, model, tok, say: Say, on_trial=None) -> TuneResult:
    """The profile's tune of a loaded model, stored nowhere: the grid's fastest decode config on calibration prompts
    (`evaluation.tune`), then AR against it at the crossover batch sizes (its serving prior)."""
    from jf_core.evaluation.tune import TuneSpace, measure_crossover, tune
    from jf_core.model_dir import ServingPrior
    from jf_core.models import stop_tokens
    from jf_core.trajectory.prompts import calibration_prompts

    cfg = profile.evaluation.tune
    prompts = calibration_prompts(profile.prompts, tok, cfg.prompts, profile.evaluation.calibration_split)
    space, new_tokens = TuneSpace.of(cfg), cfg.max_new_tokens or profile.evaluation.max_new_tokens
    grid = f"tuning {len(space.for_model(model, new_tokens))} decode configs on {len(prompts)} prompts"
    stop = stop_tokens(model, tok)
    best, trials = tune(
        model,
        prompts,
        stop=stop,
        max_new_tokens=new_tokens,
        space=space,
        repeats=cfg.repeats,
        rungs=cfg.rungs,
        progress=on_trial,
        say=lambda line: say(f"{grid}: {line}"),
    )
    serving = None
    if cfg.crossover_batch_sizes:
        found = measure_crossover(
            model,
            prompts,
            best,
            stop=stop,
            batch_sizes=cfg.crossover_batch_sizes,
            repeats=cfg.repeats,
            min_seconds=profile.evaluation.min_timed_seconds,
            progress=lambda b, x, tpf: say(f"crossover: batch {b}: Jacobi {x:.2f}x AR (TPF {tpf:.2f})"),
        )
        weights = next(model.parameters())
        serving = ServingPrior.measured(found, weights.device, str(weights.dtype).removeprefix("torch."))
    return TuneResult(best=best, calibration_prompts=len(prompts), trials=trials, serving=serving)


def stage_tune_untrained(
    profile: Profile, model_in: str, progress: Say | None = None, *, on_reuse: Say | None = None
) -> TuneResult | None:
    """The same tune on the model a round trains from (`tune_model`), for its untrained anchor rows: what a user
    would get from our decoder without training. Kept under the runs directory keyed by the model's content (the
    input model may be a registry's or a package's, not ours to write), so rounds from the same base tune it once.
    None when the tune or the anchors are off."""
    if not (profile.evaluation.tune.enabled and profile.evaluation.untrained):
        return None
    work = partial(timed_work, profile, _tune_untrained, profile, model_in, say=progress or log.info)
    what = f"the untrained tune of {model_in}"
    return run_stage(untrained_tune_path(profile, model_in), TuneResult, work, what=what, on_reuse=on_reuse)


def _tune_untrained(profile: Profile, model_in: str, say: Say) -> TuneResult:
    from jf_core.models import load_model

    model, tok = load_model(model_in, **profile.model.decode_kwargs())
    return tune_model(profile, model, tok, say)


@contextmanager
def eval_threads(profile: Profile) -> Iterator[int]:
    """One thread count for a whole evaluation (its methods take turns: a count changed between turns would bias
    the ratios): compute.threads, else the CPUs free of other processes when it starts. The caller's count is put
    back after, so the next task in this process (a worker runs several) starts from its own."""
    import torch

    from jf_core.threads import choose_threads

    before = torch.get_num_threads()
    torch.set_num_threads(profile.compute.threads or choose_threads())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def untrained_anchors(profile: Profile, model_in: str, tuning: TuneResult | None):
    """The anchors a trained model's evaluation carries (`evaluate.Untrained`): its input model, with the config
    `stage_tune_untrained` found on it; None when `evaluation.untrained` is off."""
    from jf_core.evaluation.anchors import Untrained

    if not profile.evaluation.untrained:
        return None
    if tuning is None:
        return Untrained(model_in)
    above = tuning.serving.ar_above_batch if tuning.serving is not None else None
    return Untrained(model_in, tuning.best, above)  # its rows decode evaluation.max_new_tokens (build_methods)


def stage_evaluate(
    profile: Profile,
    model_path: str,
    *,
    untrained=None,
    progress: Say | None = None,
    reuse: bool = True,
    on_reuse: Say | None = None,
    hold: Hold | None = None,
) -> Evaluation:
    """Accuracy, TPF, identity with greedy AR and TPS (every method taking turns) of one model
    (jf_core/evaluation/evaluate.py). Its marker is the evaluation itself, at a path keyed by the model's content and
    the evaluation config (paths.eval_path): a model trained again to the same weights is not measured twice.
    `untrained`: the anchors that join it (`untrained_anchors`). `progress` gets a line per batch (default: this
    module's log). `reuse=False` measures again and replaces the kept evaluation (`jf eval`)."""
    from jf_core.evaluation.results import Evaluation

    work = partial(timed_work, profile, _evaluate, profile, model_path, untrained, progress=progress or log.info)
    anchors = None if untrained is None else {**asdict(untrained), "model_path": model_identity(untrained.model_path)}
    out = eval_path(profile, model_path, anchors)
    what = f"the evaluation of {model_path}"
    return run_stage(out, Evaluation, work, what=what, reuse=reuse, on_reuse=on_reuse, hold=hold)


def _evaluate(profile: Profile, model_path: str, untrained, progress: Say) -> Evaluation:
    from jf_core.evaluation.evaluate import evaluate_profile

    with eval_threads(profile) as threads:
        result = evaluate_profile(model_path, profile, untrained=untrained, progress=progress)
    return result.model_copy(update={"model": model_path, "torch_threads": threads})
