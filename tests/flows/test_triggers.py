"""Event-triggered deployments on a real Prefect server, deployed from the project's prefect.yaml with the Prefect
CLI: `jf prompts add` (a real subprocess) stores a prompt file and its event starts `jf-round/retrain-on-new-prompts`
from the champion with that file as `new_prompts`; a champion change, emitted the way the registering task emits
it, starts `jf-benchmark/champion` on the new version. The runs these create are checked against the flows'
parameter schemas by the server; tests/flows/test_round.py runs a round from the champion with new prompts merged,
and checks the champion event a passing gate emits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect import flow

from jacobi_forcing.tasks import events

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def deployed(prefect_server):
    """prefect.yaml's two triggered deployments on the server, as `prefect deploy` makes them."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    prefect = [sys.executable, "-m", "prefect", "--no-prompt"]
    subprocess.run([*prefect, "work-pool", "create", "jf-pool", "--type", "process"], env=env, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    out = subprocess.run(
        [*prefect, "deploy", "--name", "retrain-on-new-prompts", "--name", "champion"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return env


def _runs_of(deployment: str, timeout: float = 90.0) -> list:
    """Flow runs of `flow/deployment`, waiting until the trigger's automation has created one."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [r for r in client.read_flow_runs() if r.deployment_id == dep.id]
            if runs:
                return runs
            time.sleep(2)
    return []


def test_a_prompt_file_added_starts_a_round_from_the_champion_with_it(deployed, tmp_path):
    prompts = tmp_path / "new-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"program: a={i}; step +1; return a"}) + "\n" for i in range(5)))
    env = {**deployed, "JF_HOME": str(tmp_path / "home")}
    add = subprocess.run(
        [sys.executable, "-m", "jf_cli.main", "prompts", "add", str(prompts)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert add.returncode == 0, add.stdout + add.stderr
    stored = next((tmp_path / "home" / "prompts" / "added" / "tiny").glob("*-new-prompts.jsonl"))
    assert stored.read_bytes() == prompts.read_bytes()
    assert f"5 prompts stored at {stored}" in add.stdout and events.PROMPTS_ADDED in add.stdout

    runs = _runs_of("jf-round/retrain-on-new-prompts")
    assert len(runs) == 1, runs
    assert runs[0].parameters == {"profile": "tiny", "model": "models:/jf-tiny@champion", "new_prompts": str(stored)}


def test_a_champion_change_starts_the_benchmark_of_the_new_champion(deployed):
    @flow
    def registering():  # what round_tasks.register does once the gate has moved the alias
        events.champion_changed("jf-tiny", "7")

    registering()
    runs = _runs_of("jf-benchmark/champion")
    assert len(runs) == 1, runs
    assert runs[0].parameters == {"profile": "tiny", "model": "models:/jf-tiny/7"}


def test_adding_prompts_without_a_server_says_so_and_keeps_the_file(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "program: a=1; return a"}) + "\n")
    env = {**os.environ, "JF_HOME": str(tmp_path / "home"), "PREFECT_API_URL": ""}
    add = subprocess.run(
        [sys.executable, "-m", "jf_cli.main", "prompts", "add", str(prompts)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert add.returncode == 2
    assert "PREFECT_API_URL is not set" in add.stderr and "run the same command again" in add.stderr
    assert len(list((tmp_path / "home" / "prompts" / "added" / "tiny").glob("*-p.jsonl"))) == 1
