"""An experiment: variants of a round's data and training from one input model, each measured on the questions it
trained on and on held-out ones. The mechanism check (does training on questions' own trajectories make the model
decode them in parallel, and what does it cost the text?) is one; the data and loss recipes of the adapter are others.

Every variant is a round of the round's own stages (jf_core/round/stages.py), nothing of its own:

- its profile is the experiment's with the variant's overrides (`training`; `trajectory` and `prompts` for a data
  recipe);
- the trajectories stage, shared by every variant with the same trajectory settings (the store is keyed by model,
  prompts and trajectory config), collected by whatever the caller passes (the Ray actor pool, or
  `collect_in_process`, one model here);
- `stage_pack` and `stage_train` in the variant's own round directory (keyed by its training config), so a run that
  died goes on where it stopped by `run_stage`'s rule (checkpoints inside a training that died) and a variant
  trained before is read back, not trained again;
- the measurement, a stage too (`Measured`, a marker in the round directory made from the trained model's): plain
  Jacobi at the trajectories' block size against our AR, through `build_methods` and the one timer (`speed.bench`),
  on the trained questions and the held-out ones: TPF (each block's first draft made as the trajectories' were:
  `trajectory.draft_init`), identity with its own greedy AR (the decoder's promise: 1.0 in fp32), identity with the
  input model's greedy AR and the tokens kept before the text departs, the repeated-4-gram rate, and accuracy where
  the questions' rows can be scored. A TPF that comes with changed or degenerate text is not a result: the table
  puts them side by side. The input model's row is measured once per question set, under the experiments' directory.

A variant with `training.draft_lora` trains a draft-only adapter (jf_core/draft_adapter/): the base verifies, so
"= base text" is 1.0 by construction, and measured.

The measurement is measure.py's; what a variant and a seed are, variants.py's (`--seeds`: each variant once per
seed, as the ablation runs them). A run that died is taken up by the same call.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from jf_core.config import Profile
from jf_core.evaluation.tables import markdown
from jf_core.experiments.measure import Measure, Measured, SetFigures
from jf_core.experiments.variants import variant_profile
from jf_core.round.paths import RoundPaths, model_identity, round_paths
from jf_core.round.results import PackResult, TrainResult, TrajectoriesResult, run_stage
from jf_core.round.stages import stage_pack, stage_train, stage_trajectories

Collect = Callable[[Profile, Path], TrajectoriesResult]


class ExperimentRow(BaseModel):
    """A row of the experiment's table: the input model ("base") or one variant's trained model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str
    overrides: dict = {}
    trained: SetFigures
    held_out: SetFigures
    train_seconds: float = 0.0
    train_tokens: int = 0  # tokens in the packed sequences trained on (both copies of every block, prompts)
    final: dict = {}  # the last logged training metrics
    trajectories: dict = {}  # the data trained on: its kind, blocks, tokens generated, seconds, tokens/s
    history: list[dict] = []  # training's logged rows (losses, on-policy TPF, probes)
    model: str | None = None  # where the model is (a variant's: its round's model/)

    def summary(self) -> dict:
        """The row as JSON lines hold it (plots, fits, MLflow read these): without the outputs."""
        return self.model_dump(mode="json", exclude={"trained": {"outputs"}, "held_out": {"outputs"}})


@dataclass(frozen=True)
class VariantRun:
    """One variant's round, trained: what a measure turns into the variant's row."""

    name: str
    overrides: dict
    profile: Profile
    paths: RoundPaths
    data: TrajectoriesResult
    packed: PackResult
    trained: TrainResult


# A variant's round through the training stages: trajectories -> pack -> train (in this process, `in_process`; or
# as Prefect tasks, the `jf-ablate` flow's `round_tasks.train_chain`).
Train = Callable[[Profile, str, RoundPaths], tuple[TrajectoriesResult, PackResult, TrainResult]]
R = TypeVar("R")


def in_process(collect: Collect, progress: bool = False) -> Train:
    """The training stages called in this process, trajectories collected by `collect`."""

    def train(variant: Profile, start: str, paths: RoundPaths):
        data = stage_trajectories(variant, start, paths, collect=collect)
        packed = stage_pack(variant, paths, data)
        return data, packed, stage_train(variant, start, paths, packed, progress=progress)

    return train


def run_variants(
    profile_of: Callable[[str, dict], Profile],
    model_in: str,
    runs: dict[str, dict],
    *,
    train: Train,
    measure: Callable[[VariantRun], R],
    on_row: Callable[[R], None] | None = None,
) -> list[R]:
    """The one runner of variants (seeds are variants too: `variants.seeded`): each run's profile is
    `profile_of(name, overrides)` (its `from` aside), trained by `train` from `model_in`, or from the model of the
    earlier run its `from` names, in its own round directory, then turned into a row by `measure`. Rows go to
    `on_row` as they are made; every stage is kept by its inputs, so a runner that died is taken up by the same call."""
    trained_models: dict[str, str] = {}
    rows = []
    for name, overrides in runs.items():
        start = _start(name, overrides, model_in, trained_models)
        try:
            variant = profile_of(name, {k: v for k, v in overrides.items() if k != "from"})
        except ValueError as err:
            raise ValueError(f"variant {name!r}: {err}") from None
        paths = round_paths(variant, start)
        data, packed, trained = train(variant, start, paths)
        trained_models[name] = str(paths.model)
        row = measure(VariantRun(name, overrides, variant, paths, data, packed, trained))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


INPUT_ROW = "base"  # the input model's row, untrained, first in every experiment


def run_experiment(
    profile: Profile,
    model_in: str,
    variants: dict[str, dict],
    measure: Measure,
    *,
    collect: Collect,
    on_row: Callable[[ExperimentRow], None] | None = None,
    progress: bool = False,
) -> list[ExperimentRow]:
    """The input model's row, then one per variant (`run_variants` in this process): each variant's profile is
    `variant_profile(profile, overrides)`, trained from `model_in` on the trajectories of `profile.prompts` (the
    trained questions: `measure.trained` is some or all of them). Every model is measured in fp32 on
    `profile.model.device`; training computes in the profile's model dtype there. A variant with `from` starts from
    that earlier variant's trained model (its trajectories are that model's: an adapter's, drafted by the adapter)."""
    if INPUT_ROW in variants:  # its row would read as the input model's in every table and plot
        raise ValueError(f"a variant may not be named {INPUT_ROW!r}: that is the input model's row (rename it)")
    device = profile.model.device
    emit = on_row or (lambda _row: None)
    base_marker = profile.runs_dir() / profile.name / "experiments" / f"{model_identity(model_in)}-{measure.key()}.json"
    base = run_stage(
        base_marker, Measured, lambda: measure.model(model_in, device, None), what="the input model's figures"
    )
    first = ExperimentRow(variant=INPUT_ROW, trained=base.trained, held_out=base.held_out, model=model_in)
    emit(first)

    def row(run: VariantRun) -> ExperimentRow:
        trained = run.trained
        figures = run_stage(
            run.paths.root / f"measured-{measure.key()}.json",
            Measured,
            partial(measure.model, str(run.paths.model), device, base),
            what=f"variant {run.name!r}'s figures",
            inputs={"model": trained},
        )
        return ExperimentRow(
            variant=run.name,
            overrides=run.overrides,
            trained=figures.trained,
            held_out=figures.held_out,
            train_seconds=trained.train_seconds + _seconds_before(trained.history, trained.resumed_from_step),
            train_tokens=_packed_tokens(run.profile, run.paths.examples, trained.history),
            final={k: v for k, v in (trained.history or [{}])[-1].items() if isinstance(v, float)},
            trajectories=_data_figures(run.profile, run.data),
            history=trained.history,
            model=str(run.paths.model),
        )

    rows = run_variants(
        lambda _name, overrides: variant_profile(profile, overrides),
        model_in,
        variants,
        train=in_process(collect, progress),
        measure=row,
        on_row=emit,
    )
    return [first, *rows]


def _start(name: str, overrides: dict, model_in: str, trained: dict[str, str]) -> str:
    """The model a variant trains from: `model_in`, or the model of the earlier variant its `from` names."""
    source = overrides.get("from")
    if source is None:
        return model_in
    if source not in trained:
        raise ValueError(f"variant {name!r} starts from {source!r}, which is not an earlier variant: {sorted(trained)}")
    return trained[source]


def _packed_tokens(profile: Profile, examples: Path, history: list[dict] | None) -> int:
    """How many packed tokens training went through: the trainer's count (`tokens_seen`); for a model trained before
    it counted, about that many: the examples' blocks-layout length (with every noisy copy a visit draws) times the
    sequences a step takes times the steps."""
    from jf_core.training.jf_data import read_packed_share

    counted = [row["tokens_seen"] for row in history or [] if "tokens_seen" in row]
    if counted:
        return int(counted[-1])

    t = profile.training
    lengths = [e.length_with(t.noisy_copies) for e in read_packed_share(examples, 0, 1)]
    return int(statistics.fmean(lengths) * t.steps * t.batch_size * t.grad_accum)


def _data_figures(profile: Profile, data: TrajectoriesResult) -> dict:
    """What the trajectory data was and what it cost (generation only: Ray and model start-up left out)."""
    return {
        "kind": profile.trajectory.kind,
        "blocks": data.rows,
        "tokens": data.new_tokens_generated,
        "seconds": data.pool_seconds,
        "tokens_per_s": data.tokens_per_second,
    }


def _seconds_before(history: list[dict], resumed_from: int) -> float:
    """About how long the processes before a resumed one trained: each one's last logged `elapsed_s` (which
    counts from its own start) before the checkpoint it was resumed from; 0 for a run that was not resumed."""
    total, last = 0.0, 0.0
    for row in history:
        if row["step"] >= resumed_from or "elapsed_s" not in row:
            continue
        if row["elapsed_s"] < last:  # a new process began here
            total += last
        last = row["elapsed_s"]
    return total + last


def _tpf(figures: SetFigures) -> str:
    """The first block size's TPF, the others' and K = 2's after it: `1.578 (n32 1.688, K2 1.602)`."""
    first, *more = figures.tpf_by_block_size.items() or [("", figures.tpf)]
    extra = [f"n{n} {v:.3f}" for n, v in more]
    if figures.tpf_multiblock is not None:
        extra.append(f"K2 {figures.tpf_multiblock:.3f}")
    extra += [f"{name} {v:.3f}" for name, v in figures.tpf_by_layout.items()]
    return f"{first[1]:.3f}" + (" (" + ", ".join(extra) + ")" if extra else "")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: Sequence[ExperimentRow]) -> str:
    """The rows as a Markdown table: TPF beside identity, repetition and accuracy for both question sets, and what
    the data and training cost."""
    head = [
        "variant",
        "TPF trained",
        "TPF held-out",
        "= own AR (trained / held-out)",
        "= base text (trained / held-out; median tokens kept)",
        "repetition (trained / held-out)",
        "accuracy (trained / held-out)",
        "data tokens/s",
        "train s",
        "train tokens",
    ]
    cells = [
        [
            r.variant,
            _tpf(r.trained),
            _tpf(r.held_out),
            f"{r.trained.identical_to_own_ar:.2f} / {r.held_out.identical_to_own_ar:.2f}",
            f"{r.trained.identical_to_base:.2f} / {r.held_out.identical_to_base:.2f} "
            f"({r.trained.base_prefix:.0f} / {r.held_out.base_prefix:.0f})",
            f"{r.trained.repetition:.3f} / {r.held_out.repetition:.3f}",
            f"{_share(r.trained.accuracy)} / {_share(r.held_out.accuracy)}",
            f"{r.trajectories['tokens_per_s']:.0f}" if r.trajectories else "-",
            f"{r.train_seconds:.0f}",
            str(r.train_tokens),
        ]
        for r in rows
    ]
    return markdown(head, cells)
