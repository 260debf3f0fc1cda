"""Figures (matplotlib, headless) of training and decoding: loss curves, TPF during training, accepted tokens per
forward (a round's figures put these together: jf_core/round/figures.py; an ablation's: experiments/ablation.py);
of `jf bench decode`: TPF and TPS per method, TPF against block size, the speedup against batch size; of the
mechanism check: TPF against training tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from jf_core.atomic import atomic_path
from jf_core.evaluation.growth import probe_curves
from jf_core.training.history import tpf_probes

if TYPE_CHECKING:
    from jf_core.evaluation.method import Method
    from jf_core.evaluation.speed import MethodResult

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
    """TPF against steps trained, from the training probe's rows (`training/history.TpfProbe`: plain Jacobi on
    calibration prompts). None when the run had no probe."""
    probes = tpf_probes(history)
    if not probes:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for probe in probes:
        points = probe.points(history)
        ax.plot([step + 1 for step, _ in points], [v for _, v in points], marker="o", label=f"TPF {probe.label}")
    ax.set_xlabel("steps trained")
    ax.set_ylabel("tokens per forward (the probe's prompts)")
    ax.set_title("TPF during training")
    ax.legend()
    fig.tight_layout()
    return fig


def tpf_against_tokens(runs: Sequence[dict]) -> Figure | None:
    """TPF against packed training tokens (log axis), one line per run and probed block size (`probe_curves`).
    None when no run was probed."""
    # Seven or more runs fill the axes: the legend goes beside them, where it hides no point.
    fig, ax = plt.subplots(figsize=(10, 4), layout="constrained")
    drawn = False
    for run in runs:
        for probe, points in probe_curves(run).items():
            label = f"{run['variant']} (TPF {probe.label})"
            ax.plot([t for _, t, _ in points], [v for _, _, v in points], marker="o", label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xlabel("packed training tokens")
    ax.set_ylabel("tokens per forward (each run's probe prompts)")
    ax.set_title("TPF against training tokens")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def method_bars(results: Sequence[MethodResult]) -> Figure:
    """TPF (left) and TPS (right) per method of one `jf bench decode` table."""
    names = [r.name for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, values, label in ((axes[0], [r.tpf for r in results], "TPF"), (axes[1], [r.tps for r in results], "TPS")):
        ax.bar(range(len(names)), values)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"{label} per method")
    fig.tight_layout()
    return fig


def method_acceptance(results: Sequence[MethodResult]) -> Figure:
    """Accepted tokens per forward (share of forwards) of every multi-token method of one table."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r.accepted_histogram and max(r.accepted_histogram) > 1:
            total = sum(r.accepted_histogram.values())
            ks = sorted(r.accepted_histogram)
            ax.plot(ks, [r.accepted_histogram[k] / total for k in ks], marker=".", label=r.name)
    ax.set_xlabel("tokens accepted in one forward")
    ax.set_ylabel("share of forwards")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _model_title(tag: str | None) -> str:
    """A row's model as a legend or panel names it: the model under evaluation, the trained one beside it."""
    return {None: "base model", "jf": "Jacobi Forcing model"}.get(tag, f"{tag} model")


def tpf_against_block_size(results: Sequence[MethodResult]) -> Figure | None:
    """Plain Jacobi's TPF against the block size n, one line per model (the base model's rows and the Jacobi Forcing
    model's). None when the table has fewer than two block sizes of every model."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        if r.method.kind == "jacobi":
            lines.setdefault(_model_title(r.method.model), []).append((r.method.block_size, r.tpf))
    lines = {k: sorted(v) for k, v in lines.items() if len(v) > 1}
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in lines.items():
        ax.plot([n for n, _ in points], [t for _, t in points], marker="o", label=label)
    sizes = sorted({n for points in lines.values() for n, _ in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("block size n")
    ax.set_ylabel("tokens per forward (TPF)")
    ax.set_title("Plain Jacobi: TPF against block size")
    ax.legend()
    fig.tight_layout()
    return fig


def speed_against_batch_size(tables: Mapping[int, Sequence[MethodResult]]) -> Figure | None:
    """Each method's speedup against our AR on the same prompts (TPS / AR's TPS, measured in the same run) against
    the batch size, from one `jf bench decode` table per batch size: one panel per model (the base model's methods,
    then the Jacobi Forcing model's when the tables have them); AR itself is the dashed line at 1. None with fewer
    than two batch sizes."""
    if len(tables) < 2:
        return None
    sizes = sorted(tables)
    panels: dict[str, list[Method]] = {}
    for r in tables[sizes[0]]:
        if r.method.kind != "ar":
            panels.setdefault(_model_title(r.method.model), []).append(r.method)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), sharey=True, squeeze=False)
    colors = plt.get_cmap("tab20").colors  # one colour per line: a panel holds up to eleven methods
    for ax, (title, group) in zip(axes[0], panels.items(), strict=True):
        for i, method in enumerate(group):
            points = [(b, r.speedup_vs_ar) for b in sizes for r in tables[b] if r.method == method]
            xs, ys = [b for b, _ in points], [x for _, x in points]
            ax.plot(xs, ys, marker="o", color=colors[i % 20], label=method.label)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("speedup against our AR (TPS ratio, same run)")
    fig.tight_layout()
    return fig


def save_figures(figures: Mapping[str, Figure | None], out_dir: Path) -> list[Path]:
    """Each figure (None: skipped) as `<name>.png` in `out_dir`, written under a temporary name and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        if fig is None:
            continue
        path = out_dir / f"{name}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)
        paths.append(path)
    return paths


def bench_figures(results: Sequence[MethodResult]) -> dict[str, Figure | None]:
    """One `jf bench decode` table's figures, by file name."""
    return {
        "tpf_tps_per_method": method_bars(results),
        "accepted_histogram": method_acceptance(results),
        "tpf_against_block_size": tpf_against_block_size(results),
    }
