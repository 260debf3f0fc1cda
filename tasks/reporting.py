"""What a round shows people: the metrics table (CLI and Prefect) and the Prefect artifacts of a round."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from jf_core.evaluation.results import adapter_part
from jf_core.evaluation.tables import markdown
from jf_core.round.report import resumed_note, stage_times

if TYPE_CHECKING:
    from jf_core.round.report import RoundReport
    from jf_core.round.results import Registration


def markdown_table(rows: list[dict]) -> str:
    head = list(rows[0])
    return markdown(head, ([r[h] for h in head] for r in rows))


def summary_markdown(report: RoundReport, registry: Registration | None, run_url: str | None) -> str:
    gate = ""
    if registry is not None:
        verdict = "passed: promoted to `champion`" if registry.gate_passed else "failed: `champion` unchanged"
        version = f"`{registry.model_name}` version {registry.version}"
        gate = f"\n**Registry**: {version} (`challenger`); gate {verdict}."
        checks = registry.gate_checks
        if checks:  # one row per check: what was compared and the verdict (jf_core/evaluation/gate.py)
            rows = [
                {"check": c.name, "verdict": "passed" if c.passed else "**failed**", "reason": c.reason} for c in checks
            ]
            gate += "\n\n" + markdown_table(rows)
        else:  # a reused registration carries its reasons only
            gate += "".join(f"\n- {r}" for r in registry.gate_reasons)
    link = f"\n\n[MLflow run]({run_url})" if run_url else ""
    head = report.headline
    adapter = adapter_part(report.eval.speedup_vs_no_adapter, report.eval.adapter_left_out).strip()
    adapter_line = f"{adapter[0].upper()}{adapter[1:]}.\n\n" if adapter else ""
    return (
        f"# Jacobi Forcing round: {report.profile}, n={report.block_size}\n\n"
        f"Accuracy **{report.accuracy:.3f}** (input model {report.base_accuracy:.3f}); "
        f"headline TPF **{head.tpf:.2f}** ({report.eval.headline_method}); "
        f"speedup vs our AR **{head.speedup_vs_ar:.2f}x**; trained {report.train.train_seconds:.0f} s"
        f"{resumed_note(report.train.resumed_from_step)}.\n\n"
        f"{stage_times(report.stage_seconds).capitalize()}.\n\n"
        f"{report.eval.versus().line(report.eval.timing_spread)}.\n\n"
        f"{adapter_line}"
        f"Identical to greedy AR on {report.identical_fraction:.3f} of the evaluation prompts "
        f"({report.eval.dtype}).\n\n"
        f"{markdown_table(report.metrics_rows())}\n\n"
        f"Input model: `{report.model_in}`  \nOutput model: `{report.model}`\n{gate}{link}\n"
    )


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def publish(report: RoundReport, registry: Registration | None, run_url: str | None) -> None:
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    key = artifact_key("jf-round", report.profile, f"n{report.block_size}")
    create_markdown_artifact(summary_markdown(report, registry, run_url), key=key, description="round summary")
    create_table_artifact(report.metrics_rows(), key=f"{key}-metrics", description="TPF and TPS per block size")
    if run_url:
        create_link_artifact(run_url, link_text="MLflow run of this round", key=f"{key}-mlflow")
