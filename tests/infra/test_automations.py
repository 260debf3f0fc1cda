"""Crashed-run detection on a real Prefect server and MLflow store: the stack's automations mark a flow run that
stopped heartbeating `Crashed` (its process died without a word) and one cancelled with nothing left to stop it
`Cancelled`, and the next round closes the MLflow runs that flow run left `RUNNING` as `FAILED`, leaving the runs
of live flow runs alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from uuid import UUID

import pytest
from mlflow import MlflowClient
from prefect import flow

from jacobi_forcing.infra import automations
from jacobi_forcing.tasks import mlflow_runs
from jacobi_forcing.tasks.round_tasks import flow_run_state

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]  # waits through the automations' windows


@flow(name="jf-heartbeat-probe")
def probe() -> None:
    """Never run: a flow for the runs the test creates."""


def _running_flow_run() -> str:
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        return str(client.create_flow_run(probe, state=Running()).id)


SLEEPER = """
import sys, time
from prefect import flow
from prefect.runtime import flow_run

@flow(name="jf-sleeper")
def sleeper():
    print(flow_run.id, flush=True)
    time.sleep(600)

sleeper()
"""


def _start_flow_process(api: str) -> tuple[subprocess.Popen, str]:
    """A flow run in its own process, heartbeating every 30 s as the stack's worker runs them."""
    env = {
        **os.environ,
        "PREFECT_API_URL": api,
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(automations.HEARTBEAT_SECONDS),
    }
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


@pytest.mark.faults
def test_a_killed_flow_run_ends_crashed_a_cancelled_dead_one_cancelled_and_a_live_one_runs(prefect_server):
    """The automations' rules, with their windows at the shortest a 30 s heartbeat allows (crashed after 60 s of
    silence, cancelled 60 s after a cancel request nothing acted on; the stack's own 90 s and 120 s are what
    tests/infra/test_stack_e2e.py's killed worker meets): a flow run's process SIGKILLed mid-run (what losing its
    machine does) ends `Crashed`, the automations installed again meanwhile (a worker restarted); one killed and then
    cancelled (`prefect flow-run cancel` with no worker left to stop it) ends `Cancelled`, not stuck `Cancelling`;
    their sibling, alive and heartbeating, stays `Running`."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    first = automations.install(prefect_server)  # the stack's settings
    assert set(first) == {automations.ZOMBIE_AUTOMATION, automations.CANCEL_AUTOMATION}
    missed_after, cancel_after = 2 * automations.HEARTBEAT_SECONDS, 60
    # Installed once: a second install brings the same automations up to date in place (here, to short windows).
    assert automations.install(prefect_server, missed_after=missed_after, cancel_after=cancel_after) == first
    killed, killed_id = _start_flow_process(prefect_server)
    cancelled, cancelled_id = _start_flow_process(prefect_server)
    alive, alive_id = _start_flow_process(prefect_server)
    try:
        assert {flow_run_state(i) for i in (killed_id, cancelled_id, alive_id)} == {"RUNNING"}
        for proc in (killed, cancelled):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with get_client(sync_client=True) as client:  # what `prefect flow-run cancel` asks of the server
            client.set_flow_run_state(UUID(cancelled_id), Cancelling())
        # `jf stack up` restarting the dead worker installs the automations again: as they are, they are left alone
        # (an update would give the trigger a new id and forget the killed run's open heartbeat window).
        assert automations.install(prefect_server, missed_after=missed_after, cancel_after=cancel_after) == first
        wait = max(automations.HEARTBEAT_SECONDS + missed_after, cancel_after)
        deadline = time.monotonic() + wait + 60
        while time.monotonic() < deadline and (flow_run_state(killed_id), flow_run_state(cancelled_id)) != (
            "CRASHED",
            "CANCELLED",
        ):
            time.sleep(5)
        assert flow_run_state(killed_id) == "CRASHED"
        assert flow_run_state(cancelled_id) == "CANCELLED"
        assert flow_run_state(alive_id) == "RUNNING"  # still heartbeating
    finally:
        for proc in (killed, cancelled, alive):
            proc.kill()
            proc.wait()


@pytest.mark.faults
def test_mlflow_runs_of_ended_flow_runs_are_closed_failed(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    dead, alive = _running_flow_run(), _running_flow_run()
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(UUID(dead), Crashed(message="killed"), force=True)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_client = MlflowClient(uri, uri)
    experiment = mlflow_client.create_experiment("reap")
    runs = {
        name: mlflow_client.create_run(experiment, tags=tags).info.run_id
        for name, tags in {
            "dead": {"prefect.flow_run_id": dead},
            "alive": {"prefect.flow_run_id": alive},
            "untagged": {},
            "unknown": {"prefect.flow_run_id": "00000000-0000-0000-0000-000000000000"},
        }.items()
    }
    assert mlflow_runs.reap(mlflow_client, experiment, flow_run_state) == [runs["dead"]]
    status = {name: mlflow_client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert status == {"dead": "FAILED", "alive": "RUNNING", "untagged": "RUNNING", "unknown": "RUNNING"}
    closed = mlflow_client.get_run(runs["dead"]).data.tags["jf.closed_by"]
    assert closed == f"Prefect flow run {dead} ended CRASHED"
    assert mlflow_runs.reap(mlflow_client, experiment, flow_run_state) == []  # nothing twice
