"""An experiment's rows in MLflow (jf_core/experiments/; the command is bench/mechanism.py's `--mlflow`).

Each row is a run in the profile's store and experiment, tagged `jf.kind: experiment`: the variant's overrides as
params, its figures on the trained and held-out questions as metrics, its training history as metrics by step
(losses, `probe_tpf_n16`: the TPF-against-tokens curve, with `probe_tokens`, the packed tokens by each probe), the
curve's fits (jf_core/evaluation/growth.py) as metrics, and the plot as an artifact. Rows are the summaries' JSON
(`ExperimentRow.summary()`), so rows a GPU machine wrote are logged the same way afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from jacobi_forcing.tasks.mlflow_runs import connect, mlflow_run
from jf_core.config import Profile
from jf_core.evaluation.growth import curve_fits, probe_curves
from jf_core.experiments.variants import SECTIONS


def log_experiment(profile: Profile, rows: list[dict], plot: Path | None = None, source: str = "") -> list[str]:
    """Each row as an MLflow run (see the module docstring); `source` says what made them. Returns the run ids."""
    client: MlflowClient
    client, experiment = connect(profile)
    ids = []
    for row in rows:
        tags = {"jf.kind": "experiment", "jf.variant": row["variant"], "jf.source": source}
        with mlflow_run(client, experiment, f"experiment {row['variant']}", profile=profile, tags=tags) as run_id:
            for section, value in _params(row["overrides"]).items():
                client.log_param(run_id, section, json.dumps(value))
            for part in ("trained", "held_out"):
                for key, value in row[part].items():
                    if isinstance(value, int | float):
                        client.log_metric(run_id, f"{part}.{key}", float(value))
            # A run stopped before its final measurement keeps its probes only (no seconds, no figures).
            if "train_seconds" in row:
                client.log_metric(run_id, "train_seconds", row["train_seconds"])
            client.log_metric(run_id, "train_tokens", row["train_tokens"])
            for h in row.get("history") or []:
                for key, value in h.items():
                    if key != "step" and isinstance(value, int | float):
                        client.log_metric(run_id, key, float(value), step=int(h["step"]))
            # Probed sizes share their steps: one `probe_tokens` series places them all.
            for step, tokens, _ in next(iter(probe_curves(row).values()), []):
                client.log_metric(run_id, "probe_tokens", tokens, step=step)
            for fit in curve_fits([row]):  # the fits behind the budgets, e.g. fit.log10.n16.tokens_tpf_2.0
                for name, value in fit.metrics().items():
                    client.log_metric(run_id, name, value)
            if plot is not None and plot.is_file():
                client.log_artifact(run_id, str(plot))
            ids.append(run_id)
    return ids


def _params(overrides: dict) -> dict:
    """A variant's overrides as params, one per field (`training.lr`); rows written before variants had sections
    hold training's fields bare."""
    if overrides and set(overrides) <= set(SECTIONS):
        return {f"{section}.{key}": v for section, fields in overrides.items() for key, v in fields.items()}
    return dict(overrides)
