"""A round's figures, logged to its MLflow run: the loss curves, TPF during training (when probed), TPF per round
beside the base model's, and the accepted tokens per forward of the trained model against the base's."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from jf_core.evaluation.plots import acceptance_histogram, loss_curves, plt, tpf_during_training
from jf_core.round.report import RoundReport, RoundSummary


def tpf_per_round(reports: Sequence[RoundSummary]) -> Figure:
    """Grouped bars: for each block size, the base model's TPF, then each round's."""
    sizes = sorted({n for r in reports for n in r.tpf}, key=int)
    series = [("base", reports[0].base_tpf)] + [(f"round {i} (n={r.block_size})", r.tpf) for i, r in enumerate(reports)]
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


def round_figures(report: RoundReport, history: Sequence[RoundSummary] | None = None) -> dict[str, Figure]:
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
