"""Ablations at equal compute: named variants of a profile, several seeds each, and the table they make (the
`jf-ablate` flow runs them by run.py's `run_variants`, its stages as Prefect tasks; a run's overrides are
variants.py's `run_overrides`).

A variant is a set of profile overrides (any knob can be ablated); every variant of one ablation trains the same
steps on the same prompts from the same model with the same seeds (`training.seed`: batch order and the random
schedule's draws), so the only difference between two rows is the variant. Variants that change the trajectories
(`trajectory.draft_init`) collect their own; the others share one trajectory store.

`VARIANTS` is the catalog of variants; `PAPER` holds the paper's figures for the rows it has (arXiv
2512.14681, Table 4: HumanEval accuracy / iterations per token at 10k examples; iterations per token = 1 / TPF).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jf_core.config import StrictModel
from jf_core.decoding import JFDecodeConfig
from jf_core.evaluation import tables
from jf_core.training.noise import NoiseProfile

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _jf(schedule: str, window: int, mask: str = "shipped", **training) -> dict[str, dict]:
    """A Jacobi Forcing variant, whole: method and mask are set, so the row does not depend on the profile's
    defaults (the `tiny` profile itself ships CLLM)."""
    return {"training": {"method": "jacobi_forcing", "schedule": schedule, "window": window, "mask": mask, **training}}


# Short answers matter here: the embedded task's answers hold 3-8 blocks at n=16 (median 4: `jf ablate` logs the
# measured distribution), so a 16-level progressive window never climbs past its first half; w=4 matches them.
VARIANTS: dict[str, dict[str, dict]] = {
    "jf random w16": _jf("random", 16),
    "jf progressive w16": _jf("progressive", 16),
    "jf reverse w16": _jf("reverse", 16),
    "jf random w4": _jf("random", 4),
    "jf progressive w4": _jf("progressive", 4),
    "jf reverse w4": _jf("reverse", 4),
    # Progressive's levels without its tie of level to block position: each answer starts at a random level.
    "jf progressive w16 random phase": _jf("progressive_phase", 16),
    "jf progressive w16 clean-context mask": _jf("progressive", 16, mask="clean_context"),
    # The masks differ only where the context is noisy: under progressive w16 on short answers it rarely is.
    "jf random w16 clean-context mask": _jf("random", 16, mask="clean_context"),
    "jf random w16 no AR-mix": _jf("random", 16, mix_ar_every=0),
    "jf random w16 drafts uniform vocab": {**_jf("random", 16), "trajectory": {"draft_init": "random_vocab"}},
    "jf random w16 drafts repeat-last": {**_jf("random", 16), "trajectory": {"draft_init": "repeat_last"}},
    "cllm": {"training": {"method": "cllm", "mask": "clean_context"}},
}

# (accuracy, iterations per token) from the paper's Table 4 (windows 8/16/32) for the rows this catalog shares.
PAPER: dict[str, tuple[float, float]] = {
    "jf random w16": (0.835, 0.51),
    "jf progressive w16": (0.817, 0.46),
    "jf reverse w16": (0.829, 0.62),
}
PAPER_NOTES = {
    "jf progressive w16 clean-context mask": "paper: 1.9x vs 3.6x speedup (Table 5)",
    "cllm": "paper: CLLM TPF 2.1-2.7 vs JF 2.7-4.0",
}


class AblationConfig(StrictModel):
    """What `jf ablate` / the `jf-ablate` flow runs: `variants` (names from `VARIANTS`, or name -> overrides for
    any other), `seeds` (each variant trains once per seed) and `overrides` applied to every variant first (equal
    compute: steps, data, evaluation)."""

    variants: list[str] = Field(default_factory=lambda: list(VARIANTS))
    custom: dict[str, dict[str, dict]] = Field(default_factory=dict)  # name -> profile overrides, beside the catalog's
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    # The multi-block decode every trained model is also measured with (TPF, beside plain Jacobi at each block
    # size): where Jacobi Forcing's noisy context should matter, since a block behind an unconverged one is drafted
    # on noisy context, which plain Jacobi never does. Recycling off, so TPF counts the model's own drafts only.
    multiblock: JFDecodeConfig = Field(default_factory=lambda: JFDecodeConfig(block_size=16, num_blocks=2, pool_size=0))

    def multiblock_config(self, max_new_tokens: int) -> JFDecodeConfig:
        return replace(self.multiblock, max_new_tokens=max_new_tokens)

    @field_validator("variants")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; the catalog: {sorted(VARIANTS)} (or pass custom)")
        return names

    def catalog(self) -> dict[str, dict[str, dict]]:
        chosen = {name: VARIANTS[name] for name in self.variants}
        clash = sorted(set(chosen) & set(self.custom))
        if clash:
            raise ValueError(f"custom variant(s) {clash} reuse catalog names")
        return {**chosen, **self.custom}


def _spread(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


class AblationRun(BaseModel):
    """One (variant, seed): what `jf-ablate` measured of the model it trained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str
    seed: int
    accuracy: float
    tpf: dict[str, float]  # plain Jacobi's TPF by block size
    multiblock_tpf: float = math.nan  # under the ablation's multi-block decode
    noise: NoiseProfile  # what the variant's schedule picked
    train_seconds: float = 0.0
    round_dir: str = ""


Spread = tuple[float, float]  # mean and standard deviation over seeds


class AblationRow(BaseModel):
    """A variant over its seeds: a row of the table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str
    seeds: list[int]
    accuracy: Spread
    tpf: dict[str, Spread]
    multiblock_tpf: Spread
    picked_noise: Spread
    noisy_half: Spread  # the share of blocks whose noisy copy is wrong past its middle
    paper: tuple[float, float] | None = None  # (accuracy, iterations per token) where the paper has the row


class InputFigures(BaseModel):
    """The input model's row: accuracy and TPF by block size, measured once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accuracy: float
    tpf: dict[str, float]


class Margin(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    difference: float
    ratio: float
    t: float  # Welch's t statistic


class AblationResult(BaseModel):
    """What `jf-ablate` returns (and `jf ablate --out` writes as results.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    summary: list[AblationRow]
    runs: list[AblationRun]
    table: str  # the Markdown table
    note: str  # what ran, and how long the answers were
    input_model: InputFigures
    seconds: float
    mlflow_run_id: str
    config: AblationConfig


def summarize(runs: Sequence[AblationRun]) -> list[AblationRow]:
    """Per variant (in first-seen order): mean and standard deviation over seeds of accuracy, TPF per block size,
    multi-block TPF and the picked noise ratio."""
    by_variant: dict[str, list[AblationRun]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(run)
    rows = []
    for name, group in by_variant.items():
        sizes = sorted({n for r in group for n in r.tpf}, key=int)
        rows.append(
            AblationRow(
                variant=name,
                seeds=sorted(r.seed for r in group),
                accuracy=_spread([r.accuracy for r in group]),
                tpf={n: _spread([r.tpf[n] for r in group]) for n in sizes},
                multiblock_tpf=_spread([r.multiblock_tpf for r in group]),
                picked_noise=_spread([r.noise.picked_mean for r in group]),
                noisy_half=_spread([r.noise.picked_above_half for r in group]),
                paper=PAPER.get(name),
            )
        )
    return rows


def margin(rows: Sequence[AblationRow], winner: str, baseline: str, n: str) -> Margin:
    """TPF of `winner` over `baseline` at block size n ("multiblock": the multi-block decode): the difference of
    means, their ratio and a Welch t statistic."""

    def tpf(row: AblationRow) -> Spread:
        return row.multiblock_tpf if n == "multiblock" else row.tpf[n]

    row_a, row_b = (next(r for r in rows if r.variant == name) for name in (winner, baseline))
    a, b = tpf(row_a), tpf(row_b)
    k_a, k_b = len(row_a.seeds), len(row_b.seeds)
    se = math.sqrt(a[1] ** 2 / k_a + b[1] ** 2 / k_b)
    return Margin(difference=a[0] - b[0], ratio=a[0] / b[0], t=(a[0] - b[0]) / se if se > 0 else math.inf)


def _pm(stat: tuple[float, float], digits: int = 2, scale: float = 1.0) -> str:
    mean, sd = stat
    return f"{mean * scale:.{digits}f} ± {sd * scale:.{digits}f}"


def markdown(rows: Sequence[AblationRow], base: InputFigures | None = None, multiblock: str = "multi-block") -> str:
    """The ablation table: accuracy (%), TPF per block size, multi-block TPF and iterations per token at the first
    block size (mean ± sd over seeds), the noise the schedule picked, and the paper's figures where it has the row."""
    sizes = sorted({n for r in rows for n in r.tpf}, key=int)
    head = ["variant", "seeds", "accuracy %", *[f"TPF n={n}" for n in sizes], f"TPF {multiblock}"]
    head += [f"iter/token n={sizes[0]}"]
    head += ["picked noise ratio", "blocks with ratio > 0.5", "paper: accuracy / iter/token"]
    lines = []
    if base is not None:
        cells = ["input model", "-", f"{100 * base.accuracy:.2f}", *[f"{base.tpf[n]:.2f}" for n in sizes]]
        lines.append([*cells, "-", f"{1 / base.tpf[sizes[0]]:.3f}", "-", "-", "-"])
    for r in rows:
        mean_tpf, sd_tpf = r.tpf[sizes[0]]
        iters = 1 / mean_tpf
        iters_sd = sd_tpf / mean_tpf**2  # first-order propagation of the TPF spread
        cells = [
            r.variant,
            str(len(r.seeds)),
            _pm(r.accuracy, scale=100),
            *[_pm(r.tpf[n]) for n in sizes],
            "-" if math.isnan(r.multiblock_tpf[0]) else _pm(r.multiblock_tpf),
            f"{iters:.3f} ± {iters_sd:.3f}",
            _pm(r.picked_noise),
            _pm(r.noisy_half),
            f"{100 * r.paper[0]:.1f}% / {r.paper[1]:.2f}" if r.paper else PAPER_NOTES.get(r.variant, "-"),
        ]
        lines.append(cells)
    return tables.markdown(head, lines) + "\n"


def figure(rows: Sequence[AblationRow]) -> Figure:
    """The summary's rows as bars: TPF per block size (left) and accuracy (right), mean with one standard
    deviation over seeds as error bars."""
    from jf_core.evaluation.plots import plt  # pyplot on the headless backend

    sizes = sorted({n for r in rows for n in r.tpf}, key=int)
    names = [r.variant for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 2), sharey=True)
    height = 0.8 / len(sizes)
    for i, n in enumerate(sizes):
        ys = [j + i * height for j in range(len(rows))]
        left.barh(ys, [r.tpf[n][0] for r in rows], height, xerr=[r.tpf[n][1] for r in rows], label=f"n={n}")
    left.set_yticks([j + 0.4 - height / 2 for j in range(len(rows))], names)
    left.invert_yaxis()
    left.set_xlabel("tokens per forward (TPF)")
    left.legend()
    right.barh(
        [j + 0.4 - height / 2 for j in range(len(rows))],
        [100 * r.accuracy[0] for r in rows],
        0.6,
        xerr=[100 * r.accuracy[1] for r in rows],
        color="tab:gray",
    )
    low = min(100 * (r.accuracy[0] - r.accuracy[1]) for r in rows)
    right.set_xlim(max(0.0, low - 5), 100)
    right.set_xlabel("accuracy % (greedy)")
    seeds = sorted({len(r.seeds) for r in rows})
    fig.suptitle(f"Ablation at equal compute: mean ± sd over {'/'.join(map(str, seeds))} seeds")
    fig.tight_layout()
    return fig
