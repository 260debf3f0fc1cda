"""Prefect automations the stack installs: a flow run whose process died without a word is marked `Crashed`.

A worker or node killed mid-round (SIGKILL, an OOM kill, a lost machine) leaves its flow run `Running` forever:
nothing is left to report its end. Flow runs emit heartbeat events (every `HEARTBEAT_SECONDS`, set in the worker's
environment by `jf stack up`); this proactive automation marks a run `Crashed` when neither a heartbeat nor a
terminal state followed its last heartbeat within `MISSED_AFTER_SECONDS` (Prefect's documented zombie-run recipe).
Its MLflow runs are then closed `FAILED` by the next round (`tracking.reap`).
"""

from __future__ import annotations

from datetime import timedelta

ZOMBIE_AUTOMATION = "jf: crash flow runs that stopped heartbeating"
HEARTBEAT_SECONDS = 30  # Prefect's minimum
MISSED_AFTER_SECONDS = 3 * HEARTBEAT_SECONDS


def zombie_automation(missed_after: int = MISSED_AFTER_SECONDS):
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    ended = ("Completed", "Failed", "Cancelled", "Crashed")
    return Automation(
        name=ZOMBIE_AUTOMATION,
        description="A flow run that stopped sending heartbeats (its process or machine died) is marked Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in ended)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=missed_after),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {missed_after} s: the flow run's process died",
            )
        ],
    )


def install(api_url: str, missed_after: int = MISSED_AFTER_SECONDS) -> str:
    """Create the automation on the server at `api_url` unless one of that name exists; returns its id."""
    from prefect.automations import Automation
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        try:
            return str(Automation.read(name=ZOMBIE_AUTOMATION).id)
        except ValueError:
            return str(zombie_automation(missed_after).create().id)
