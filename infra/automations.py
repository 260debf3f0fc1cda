"""Prefect automations the stack installs: a flow run whose process died without a word is marked `Crashed`, and
one cancelled while nothing is left to stop it ends `Cancelled` instead of staying `Cancelling`.

A worker or node killed mid-round (SIGKILL, an OOM kill, a lost machine) leaves its flow run `Running` forever:
nothing is left to report its end. Flow runs emit heartbeat events (every `HEARTBEAT_SECONDS`, set in the worker's
environment by `jf stack up`); this proactive automation marks a run `Crashed` when neither a heartbeat nor a
terminal state followed its last heartbeat within `MISSED_AFTER_SECONDS` (Prefect's documented zombie-run recipe).
Its MLflow runs are then closed `FAILED` by the next round (`mlflow_runs.reap`).

Cancelling is the worker's job: it stops the process and reports `Cancelled`. With the worker gone (the run's
machine lost), `prefect flow-run cancel` would leave the run `Cancelling` forever; the second automation ends a
run that reached no final state within `CANCEL_AFTER_SECONDS` of its cancel request `Cancelled`. A cancel request
also stands in for the next heartbeat, so a cancelled dead run ends `Cancelled`, not `Crashed`.
"""

from __future__ import annotations

from datetime import timedelta

ZOMBIE_AUTOMATION = "jf: crash flow runs that stopped heartbeating"
HEARTBEAT_SECONDS = 30  # Prefect's minimum
MISSED_AFTER_SECONDS = 3 * HEARTBEAT_SECONDS
CANCEL_AUTOMATION = "jf: end cancelled flow runs no worker stopped"
CANCEL_AFTER_SECONDS = 120  # a live worker stops a run and reports it within seconds (SIGTERM, then its grace)
ENDED = ("Completed", "Failed", "Cancelled", "Crashed")


def zombie_automation(missed_after: int = MISSED_AFTER_SECONDS):
    from prefect.client.schemas.objects import StateType

    return _set_state_unless(
        ZOMBIE_AUTOMATION,
        "A flow run that stopped sending heartbeats (its process or machine died) is marked Crashed.",
        after="heartbeat",
        expect={"heartbeat", "Cancelling", *ENDED},
        within=missed_after,
        state=StateType.CRASHED,
        message=f"no heartbeat for {missed_after} s: the flow run's process died",
    )


def cancel_automation(cancel_after: int = CANCEL_AFTER_SECONDS):
    from prefect.client.schemas.objects import StateType

    return _set_state_unless(
        CANCEL_AUTOMATION,
        "A flow run still Cancelling long after its cancel request (no worker to stop it) is Cancelled.",
        after="Cancelling",
        expect=set(ENDED),
        within=cancel_after,
        state=StateType.CANCELLED,
        message=f"cancelled: no worker stopped the run within {cancel_after} s of the request",
    )


def _set_state_unless(name: str, description: str, *, after: str, expect: set[str], within: int, state, message: str):
    """A proactive automation per flow run: after its `prefect.flow-run.<after>` event, unless one of `expect`
    follows within `within` seconds, set the run's state to `state`."""
    from prefect.automations import Automation
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=name,
        description=description,
        trigger=EventTrigger(
            after={f"prefect.flow-run.{after}"},
            expect={f"prefect.flow-run.{e}" for e in expect},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[ChangeFlowRunState(state=state, message=message)],
    )


def install(
    api_url: str, missed_after: int = MISSED_AFTER_SECONDS, cancel_after: int = CANCEL_AFTER_SECONDS
) -> dict[str, str]:
    """Create the automations on the server at `api_url`, or bring ones of the same names up to date (a stack made
    by an older version keeps working); returns their ids by name. One already as wanted is left alone: an update
    gives its trigger a new id on the server, which forgets the heartbeat windows it had open, so a run whose worker
    died just before `jf stack up` restarted the worker would never be marked Crashed."""
    from prefect.automations import Automation
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ids = {}
    with temporary_settings({PREFECT_API_URL: api_url}):
        for wanted in (zombie_automation(missed_after), cancel_automation(cancel_after)):
            try:
                found = Automation.read(name=wanted.name)
            except ValueError:
                ids[wanted.name] = str(wanted.create().id)
                continue
            if found.model_dump(exclude={"id"}) != wanted.model_dump(exclude={"id"}):
                wanted.id = found.id
                wanted.update()
            ids[wanted.name] = str(found.id)
    return ids
