"""Flow `jf-round`: one Jacobi Forcing round, trajectories -> pack -> train -> evaluate -> register.

    prefect deployment run jf-round/tiny                      # after `prefect deploy --all`
    prefect deployment run jf-round/tiny --params '{"model": "models:/jf-tiny@champion"}'

Parameters are a profile name (or YAML path) plus per-section overrides, validated by the project's typed config
before any work starts; `model` may be a directory, a hub id, or `models:/<name>@<alias>`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from pydantic import BaseModel

from jacobi_forcing.tasks import mlflow_runs, reporting, round_tasks
from jf_core import planning
from jf_core.config import Profile, ProfileOverrides, load_profile, merge_overrides, overrides_dict
from jf_core.model_dir import lineage_base
from jf_core.round.paths import round_paths
from jf_core.round.report import RoundSummary, round_report
from jf_core.trajectory.prompts import PromptSourceError


def load(profile: str | Profile, overrides: ProfileOverrides | dict | None, new_prompts: str | None = None) -> Profile:
    """The profile with its overrides; `new_prompts` (a prompt file an event announced) merged into its prompts.
    `profile` is a name or YAML path (what deployments pass) or a profile already built (what `jf run` passes, so
    that one command builds it once)."""
    if isinstance(profile, Profile):
        changes = overrides_dict(overrides)
        prof = Profile.model_validate(merge_overrides(profile.model_dump(), changes)) if changes else profile
    else:
        prof = load_profile(profile, **overrides_dict(overrides))
    if new_prompts:
        merged = [*prof.prompts.extra_sources, new_prompts]
        prof = prof.model_copy(update={"prompts": prof.prompts.model_copy(update={"extra_sources": merged})})
    return prof


def run_key(parameters: dict) -> str:
    """Six hex digits of the run's parameters: the same inputs give the same key, so re-runs of one round line up
    in the UI and different overrides of one profile do not look alike."""
    text = json.dumps(parameters, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def _plain(value):
    """A parameter as JSON: a built profile (or any pydantic value) by its fields, so the key names its content."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else str(value)


def round_run_name() -> str:
    """`jf-round-<profile>-n<block size>-<key>`; a run whose profile does not load keeps a readable name (the flow
    itself then fails with the profile's own error)."""
    params = dict(flow_run.parameters or {})
    profile = params.get("profile", "tiny")
    try:
        prof = load(profile, params.get("overrides"))
        name, n = prof.name, prof.trajectory.block_size
    except Exception:  # naming must never be the thing that fails
        name, n = profile_label(profile), "?"
    return f"jf-round-{name}-n{n}-{run_key(params)}"


def profile_label(profile: str | Profile | dict) -> str:
    """The profile's name as run names show it, from any form a flow run's `profile` parameter takes."""
    if isinstance(profile, Profile):
        return profile.name
    if isinstance(profile, dict):  # a built profile, as the API hands parameters back
        return str(profile.get("name", "?"))
    return str(profile).rsplit("/", 1)[-1].removesuffix(".yaml")


@flow(name="jf-round", flow_run_name=round_run_name, log_prints=True, validate_parameters=True)
def jf_round(
    profile: str | Profile = "tiny",
    overrides: ProfileOverrides | None = None,
    model: str | None = None,
    parent_run_id: str | None = None,
    history: list[RoundSummary] | None = None,
    new_prompts: str | None = None,
) -> RoundSummary:
    """`parent_run_id`: the MLflow run of a calling flow (jf-progressive); `history`: earlier rounds' reports,
    for the TPF-per-round plot; `new_prompts`: a prompt file merged into the profile's prompts (the URI a
    `jf.prompts.added` event carries: prefect.yaml's retrain-on-new-prompts)."""
    prof = load(profile, overrides, new_prompts)
    if new_prompts and not Path(new_prompts).is_file():
        raise PromptSourceError(f"new_prompts: prompt file {new_prompts} does not exist")
    planning.check(prof)  # a GPU profile that cannot fit is refused here, naming the stage and the knob
    logger = get_run_logger()
    client, experiment = mlflow_runs.connect(prof)
    for stale in mlflow_runs.reap(client, experiment, round_tasks.flow_run_state):  # left RUNNING by a dead run
        logger.warning("closed MLflow run %s as FAILED: its flow run had ended without closing it", stale)
    n = prof.trajectory.block_size
    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "jf.profile": prof.name}
    runs = {"client": client, "experiment_id": experiment, "profile": prof, "logger": logger}
    with (
        mlflow_runs.mlflow_run(name=f"jf-round {prof.name}", tags=tags, adopt=parent_run_id, **runs) as parent,
        mlflow_runs.mlflow_run(name=f"round n={n}", parent=parent, tags={**tags, "jf.n": str(n)}, **runs) as run_id,
    ):
        url = mlflow_runs.run_url(prof, experiment, run_id)
        logger.info("MLflow run %s%s", run_id, f" ({url})" if url else "")
        mlflow_runs.log_params(client, run_id, prof)
        model_in = round_tasks.resolve_model(model or prof.model.path, prof)
        paths = round_paths(prof, model_in)
        root = str(paths.root)
        logger.info("round directory %s", root)
        traj, packed, trained = round_tasks.train_chain(prof, model_in, paths)
        tuned = round_tasks.tune(prof, root, trained)
        untrained_tune = round_tasks.tune_untrained(prof, model_in)
        jf_model = str(paths.model)
        # The trained model's evaluation carries the input model's untrained anchors, timed in the same run, and where
        # they make the input model's own evaluation (one pass, one block size), that is read from it.
        jf = round_tasks.evaluate(prof, jf_model, f"{prof.training.method_name} model", model_in, untrained_tune)
        base = round_tasks.input_evaluation(jf, model_in) or round_tasks.evaluate(prof, model_in, "input model")
        origin = lineage_base(model_in)  # the gate holds every round to the chain's original base model
        lineage = None
        if origin != model_in:
            origin_path = round_tasks.resolve_model(origin, prof)
            lineage = (origin, round_tasks.evaluate(prof, origin_path, "lineage base model"))
        report = round_report(
            prof, model_in, paths, traj, packed, trained, base, jf, lineage, tune=tuned, tune_untrained=untrained_tune
        )
        report.save(paths.root / "report.json")
        champion = round_tasks.champion_figures(prof, report.eval_key)
        registration = round_tasks.register(prof, run_id, report, history or [], champion)
        reporting.publish(report, registration, url)
    summary = report.summary().model_copy(update={"registry": registration, "mlflow_run_id": run_id, "mlflow_url": url})
    logger.info(
        "round summary: accuracy %.4f, headline TPF %.3f, %.2fx our AR",
        summary.accuracy,
        summary.headline_tpf,
        summary.speedup_vs_ar,
    )
    return summary
