"""Figures of a round (matplotlib, headless): loss curves, TPF per round, accepted tokens per forward; and of an
ablation (`jf ablate`): TPF and accuracy per variant with their spread over seeds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from jf_core.round.report import RoundReport

LOSS_KEYS = ("loss", "consistency_loss", "ar_loss")


def loss_curves(history: Sequence[dict]) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [row["step"] for row in history]
    for key in LOSS_KEYS:
        if any(key in row for row in history):
            ax.plot(steps, [row.get(key, float("nan")) for row in history], label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.set_title("Jacobi Forcing training")
    ax.legend()
    fig.tight_layout()
    return fig


def tpf_per_round(reports: Sequence[dict]) -> Figure:
    """Grouped bars: for each block size, the base model's TPF, then each round's."""
    sizes = sorted({n for r in reports for n in r["tpf"]}, key=int)
    series = [("base", reports[0]["base_tpf"])] + [
        (f"round {i} (n={r['block_size']})", r["tpf"]) for i, r in enumerate(reports)
    ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, tpf) in enumerate(series):
        xs = [j + i * width for j in range(len(sizes))]
        ax.bar(xs, [tpf.get(n, 0.0) for n in sizes], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"n={n}" for n in sizes])
    ax.set_ylabel("tokens per forward (TPF)")
    ax.set_title("Vanilla Jacobi TPF per round")
    ax.legend()
    fig.tight_layout()
    return fig


def acceptance_histogram(histograms: dict[str, dict], base: dict[str, dict] | None = None, label: str = "JF") -> Figure:
    """Accepted tokens per forward (share of forwards), per block size; the base model dashed when given. `label`
    names the trained model by its method (JF, CLLM)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, hists, style in ((label, histograms, "-"), ("base", base or {}, "--")):
        for n, hist in sorted(hists.items(), key=lambda kv: int(kv[0])):
            total = sum(hist.values()) or 1
            ks = sorted(hist, key=int)
            ax.plot([int(k) for k in ks], [hist[k] / total for k in ks], style, marker=".", label=f"{name} n={n}")
    ax.set_xlabel("tokens accepted in one forward")
    ax.set_ylabel("share of forwards")
    ax.set_yscale("log")
    ax.set_title("Accepted tokens per forward")
    ax.legend()
    fig.tight_layout()
    return fig


def tpf_during_training(history: Sequence[dict]) -> Figure | None:
    """TPF against steps trained, from the training probe's rows (`probe_tpf_n<N>`: plain Jacobi on calibration
    prompts). None when the run had no probe."""
    keys = sorted({k for row in history for k in row if k.startswith("probe_tpf_n")})
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        rows = [row for row in history if key in row]
        ax.plot([row["step"] + 1 for row in rows], [row[key] for row in rows], marker="o", label=key)
    ax.set_xlabel("steps trained")
    ax.set_ylabel("tokens per forward (calibration prompts)")
    ax.set_title("TPF during training")
    ax.legend()
    fig.tight_layout()
    return fig


def round_figures(report: RoundReport, history: Sequence[dict] | None = None) -> dict[str, Figure]:
    """A round's plots; `history`: earlier rounds' `RoundReport.summary()`s, for the TPF per round."""
    curve = report.train.history
    probe = tpf_during_training(curve)
    return ({"tpf_during_training": probe} if probe is not None else {}) | {
        "loss_curves": loss_curves(curve),
        "tpf_per_round": tpf_per_round([*(history or []), report.summary()]),
        "acceptance_histogram": acceptance_histogram(
            report.eval.accepted_histogram, report.base_eval.accepted_histogram, label=report.method_name
        ),
    }


def ablation_bars(rows: Sequence[dict]) -> Figure:
    """Rows of `jf_core.ablation.summarize`: TPF per block size (left) and accuracy (right), mean with one standard
    deviation over seeds as error bars."""
    sizes = sorted({n for r in rows for n in r["tpf"]}, key=int)
    names = [r["variant"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 2), sharey=True)
    height = 0.8 / len(sizes)
    for i, n in enumerate(sizes):
        ys = [j + i * height for j in range(len(rows))]
        left.barh(ys, [r["tpf"][n][0] for r in rows], height, xerr=[r["tpf"][n][1] for r in rows], label=f"n={n}")
    left.set_yticks([j + 0.4 - height / 2 for j in range(len(rows))], names)
    left.invert_yaxis()
    left.set_xlabel("tokens per forward (TPF)")
    left.legend()
    right.barh(
        [j + 0.4 - height / 2 for j in range(len(rows))],
        [100 * r["accuracy"][0] for r in rows],
        0.6,
        xerr=[100 * r["accuracy"][1] for r in rows],
        color="tab:gray",
    )
    low = min(100 * (r["accuracy"][0] - r["accuracy"][1]) for r in rows)
    right.set_xlim(max(0.0, low - 5), 100)
    right.set_xlabel("accuracy % (greedy)")
    seeds = sorted({len(r["seeds"]) for r in rows})
    fig.suptitle(f"Ablation at equal compute: mean ± sd over {'/'.join(map(str, seeds))} seeds")
    fig.tight_layout()
    return fig


def probe_curves(run: dict) -> dict[str, list[tuple[int, float, float]]]:
    """A mechanism row's probes (`bench/mechanism.py`'s summaries: `train_tokens`, `history` with the training
    probe's `probe_tpf_n<N>`) as {key: [(step, packed tokens by then, TPF)]}: the run's tokens per step times the
    steps done."""
    history = run.get("history") or []
    steps = max((row["step"] for row in history), default=-1) + 1
    keys = sorted({k for row in history for k in row if k.startswith("probe_tpf_n")})
    per_step = run["train_tokens"] / steps if steps else 0.0
    return {
        key: [(int(row["step"]), (row["step"] + 1) * per_step, row[key]) for row in history if key in row]
        for key in keys
    }


def tpf_against_tokens(runs: Sequence[dict]) -> Figure | None:
    """TPF against packed training tokens (log axis), one line per run and probed block size (`probe_curves`).
    None when no run was probed."""
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for run in runs:
        for key, points in probe_curves(run).items():
            label = f"{run['variant']} ({key.removeprefix('probe_')})"
            ax.plot([t for _, t, _ in points], [v for _, _, v in points], marker="o", label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xlabel("packed training tokens")
    ax.set_ylabel("tokens per forward (calibration prompts)")
    ax.set_title("TPF against training tokens")
    ax.legend()
    fig.tight_layout()
    return fig
