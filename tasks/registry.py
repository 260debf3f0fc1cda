"""The model registry: a round's version, its figures as tags, and the `champion` alias moved only through the gate
(jf_core/evaluation/gate.py). Idempotent: a re-run of a registered round reuses its version."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from jacobi_forcing.tasks.model_package import log_model
from jf_core.config import Profile
from jf_core.decoding import serving_spec
from jf_core.evaluation.gate import Check, Figures, decide
from jf_core.round.results import Registration

if TYPE_CHECKING:
    from jf_core.round.report import RoundReport


def champion(client: MlflowClient, name: str):
    try:
        return client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None


def champion_figures(client: MlflowClient, name: str, eval_key: str) -> tuple[object, Figures | None]:
    """(the champion's version, its gate figures when they were measured on the evaluation `eval_key`); versions
    registered before the gate recorded figures, or measured on another evaluation, give None: re-evaluate them."""
    current = champion(client, name)
    if current is None or "jf.figures" not in current.tags:
        return current, None
    figures = Figures.from_json(current.tags["jf.figures"])
    return current, figures if figures.eval_key == eval_key else None


def registration_key(profile: Profile, report: RoundReport) -> str:
    """What makes a registration the same one again: the round (its directory names its inputs), the model it
    started from, the figures the gate read and the gate itself. A fully cached re-run has the same key."""
    parts = {
        "round": Path(report.round_dir).name,
        "model_in": report.model_in,
        "accuracy": report.accuracy,
        "base_accuracy": report.base_accuracy,
        "tpf": report.headline.tpf,
        "gate": profile.gate.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _registered(client: MlflowClient, name: str, key: str):
    """The version registered under `key` earlier, if any (a model holds few versions: read them all)."""
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get("jf.registration_key") == key), None)


def _reuse(client: MlflowClient, name: str, found) -> Registration:
    """A re-run of a registered round: its version and verdict as recorded. A registration that was killed before
    its alias moves were done (no `jf.registration: complete` tag) has them finished, never moving an alias back
    from a newer version; a complete one moves nothing (an operator's later rollback stays)."""
    version, passed = str(found.version), found.tags.get("gate") == "passed"
    reasons = [r for r in found.tags.get("gate_reasons", "").split("; ") if r]
    interrupted = found.tags.get(REGISTRATION_TAG) != "complete"
    champion_moved = False
    for alias, wanted in (("challenger", True), ("champion", passed)):
        if not wanted:
            continue
        try:
            holder = client.get_model_version_by_alias(name, alias)
        except MlflowException:
            holder = None
        if holder is None or (interrupted and int(holder.version) < int(version)):
            client.set_registered_model_alias(name, alias, version)
            champion_moved = champion_moved or alias == "champion"
    if interrupted:
        client.set_model_version_tag(name, version, REGISTRATION_TAG, "complete")
    return Registration(
        model_name=name, version=version, gate_passed=passed, gate_reasons=reasons, champion_moved=champion_moved
    )


REGISTRATION_TAG = "jf.registration"  # "complete" once a version's aliases were moved: a re-run then moves none


def register(
    client: MlflowClient, run_id: str, profile: Profile, report: RoundReport, champion_at: Figures | None = None
) -> Registration:
    """Log the model as a Jacobi Forcing pyfunc, register a new version with its figures as tags, alias it
    `challenger`, and `champion` only when the gate passes. `champion_at`: the
    champion's figures on this round's evaluation (None: its recorded ones, when measured on the same evaluation).
    Every gate check is a tag on the version (`gate.<check>`) and a metric of the run (`gate_<check>`).
    Idempotent: a re-run of a round already registered (same `registration_key`) reuses that version and moves no
    alias."""
    name = profile.model_name
    key = registration_key(profile, report)
    found = _registered(client, name, key)
    if found is not None:
        reused = _reuse(client, name, found)
        client.set_tag(run_id, "jf.registered_version", reused.version)
        client.set_tag(run_id, "jf.registration_reused", "true")
        client.set_tag(run_id, "jf.gate", "passed" if reused.gate_passed else "failed")
        return reused
    figures = report.figures
    current, recorded = champion_figures(client, name, report.eval_key)
    decision = decide(
        figures.candidate,
        input_model=figures.input,
        base_model=figures.lineage_base,
        champion=None if current is None else (champion_at or recorded or UNMEASURED),
        cfg=profile.gate,
    )
    _log_checks(client, run_id, decision.checks)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(run_id=run_id):
        info = log_model(report.model, Path(tmp), fallback_decode=report.eval.decode_config)
    gate = "passed" if decision.passed else "failed"
    tags = {
        "round": Path(report.round_dir).name,
        # Two block sizes, named apart: the trajectories' n the model was trained at, and the n its decode config
        # (tuned, or the best measured) decodes with; a lone `n=16` beside a tuned n=64 read as a contradiction.
        "train_block_size": str(report.block_size),
        "decode_block_size": str(report.eval.decode_config.block_size),
        "tpf": repr(float(report.headline.tpf)),  # full precision: the gate compares against it
        "tps": f"{report.headline.tps:.2f}",
        "speedup_vs_ar": f"{report.headline.speedup_vs_ar:.3f}",  # the headline: against our own AR, same model
        "identical_fraction": f"{report.identical_fraction:.4f}",
        "dtype": report.eval.dtype,
        "accuracy": f"{report.accuracy:.4f}",
        "base_model": report.model_in,
        "lineage_base": report.lineage_base,
        "gate": gate,
        "gate_reasons": "; ".join(decision.reasons),
        "jf.registration_key": key,
        "jf.figures": figures.candidate.to_json(),  # what a later round's gate compares with
        **{f"gate.{c.name}": f"{'passed' if c.passed else 'failed'}: {c.reason}" for c in decision.checks},
    }
    serving = serving_spec(report.model, report.eval.decode_config)
    if (prior := serving.prior) is not None:  # where a server should switch to AR, and on what it was measured
        tags["ar_above_batch"] = str(prior.ar_above_batch)
        tags["hardware"] = prior.hardware
    version = mlflow.register_model(info.model_uri, name, tags=tags).version
    client.set_registered_model_alias(name, "challenger", version)
    if decision.passed:
        client.set_registered_model_alias(name, "champion", version)
    client.set_model_version_tag(name, version, REGISTRATION_TAG, "complete")  # a killed run is finished by a re-run
    client.set_tag(run_id, "jf.registered_version", version)
    client.set_tag(run_id, "jf.gate", gate)
    return Registration(
        model_name=name,
        version=str(version),
        gate_passed=decision.passed,
        gate_reasons=decision.reasons,
        gate_checks=decision.checks,
        champion_moved=decision.passed,
    )


# A champion with no figures on this evaluation: the TPF check fails saying so (it never passes blind).
UNMEASURED = Figures(accuracy=float("nan"), tpf={}, headline_tpf=float("nan"), decode_key="", eval_key="unmeasured")


def _log_checks(client: MlflowClient, run_id: str, checks: list[Check]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"gate_{c.name}", float(c.value), now, 0) for c in checks if c.value is not None]
    metrics += [Metric(f"gate_{c.name}_passed", float(c.passed), now, 0) for c in checks]
    client.log_batch(run_id, metrics=metrics)
