"""Flow `jf-progressive`: the rounds a profile lists (growing block sizes), each a `jf-round` subflow that starts
from the previous round's model and regenerates trajectories with it, under one MLflow parent run."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from jacobi_forcing.flows.round import jf_round, load, profile_label
from jacobi_forcing.tasks import mlflow_runs
from jf_core.config import Profile, ProfileOverrides, merge_overrides, overrides_dict
from jf_core.round.report import RoundSummary


def round_overrides(overrides: ProfileOverrides | dict | None, prof, i: int) -> dict:
    spec = prof.rounds[i]
    this_round = {"trajectory": {"block_size": spec.block_size, "round_id": f"round-{i}"}}
    return merge_overrides(overrides_dict(overrides), {**this_round, "training": spec.training_overrides()})


def progressive_run_name() -> str:
    return f"jf-progressive-{profile_label(dict(flow_run.parameters or {}).get('profile', 'tiny'))}"


@flow(name="jf-progressive", flow_run_name=progressive_run_name, log_prints=True)
def jf_progressive(
    profile: str | Profile = "tiny", overrides: ProfileOverrides | None = None, model: str | None = None
) -> list[RoundSummary]:
    prof = load(profile, overrides)
    if not prof.rounds:
        raise ValueError(f"profile {prof.name!r} lists no rounds")
    client, experiment = mlflow_runs.connect(prof)
    tags = {"prefect.flow_run_id": str(flow_run.id or "")}
    summaries: list[RoundSummary] = []
    with mlflow_runs.mlflow_run(
        client, experiment, f"jf-progressive {prof.name}", profile=prof, tags=tags, logger=get_run_logger()
    ) as parent:
        for i in range(len(prof.rounds)):
            summary = jf_round(
                profile,
                overrides=round_overrides(overrides, prof, i),
                model=summaries[-1].model if summaries else model,
                parent_run_id=parent,
                history=summaries,
            )
            summaries.append(summary)
            get_run_logger().info(
                "round %d (n=%d): accuracy %.3f, TPF %s", i, summary.block_size, summary.accuracy, summary.tpf
            )
    return summaries
