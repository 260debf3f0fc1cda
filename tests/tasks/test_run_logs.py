"""jf_core's warnings in the run's log, on a real (temporary) Prefect server: what training's thread governor says
about a busy machine reaches the Prefect UI under the task that trained, and the terminal shows it once, as one
of the run's lines, not as a Python warning with a file, a line number and a source line."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

# A flow as a user's process runs it (its own terminal, Prefect's own console handler): a task whose stage logs
# through jf_core's loggers, as training's thread governor does (jf_core/threads.py).
FLOW = """
import logging

from prefect import flow, task
from prefect.logging import get_run_logger

from jacobi_forcing.tasks.run_logs import library_warnings_in_run_log

threads_log = logging.getLogger("jf.threads")


@task
def train_like_a_round():
    with library_warnings_in_run_log():
        threads_log.info("not forwarded: below a warning")
        threads_log.warning("other processes are using %.1f of the %d CPUs", 1.0, 2)
    threads_log.warning("after the task's stage: not this run's")
    assert logging.getLogger("jf").handlers == [] and logging.getLogger("jf").propagate  # as before the stage


@flow
def a_round():
    get_run_logger().info("flow started")
    train_like_a_round()


print("flow run", a_round(return_state=True).state_details.flow_run_id)
"""


def _run_logs(flow_run_id: str) -> list[tuple[int, str, bool]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read():
        async with get_client() as client:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            return [(log.level, log.message, log.task_run_id is not None) for log in logs]

    return asyncio.run(read())


def test_a_library_warning_is_a_line_of_the_task_run(prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    done = subprocess.run([sys.executable, "-c", FLOW], env=env, capture_output=True, text=True, timeout=240)
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    flow_run_id = re.search(r"flow run (\S+)", done.stdout).group(1)
    logs = _run_logs(flow_run_id)  # sent before the child exited (Prefect drains its log queue at exit)
    ours = ("CPUs", "below", "after")
    said = [(level, message, in_task) for level, message, in_task in logs if any(w in message for w in ours)]
    assert said == [(logging.WARNING, "other processes are using 1.0 of the 2 CPUs", True)], logs
    lines = [line for line in terminal.splitlines() if "other processes are using" in line]
    assert len(lines) == 1 and "| WARNING |" in lines[0] and "Task run 'train_like_a_round" in lines[0], terminal
    assert "RuntimeWarning" not in terminal and "threads_log.warning" not in terminal
