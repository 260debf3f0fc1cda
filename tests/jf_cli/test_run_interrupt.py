"""`jf run` interrupted mid-round by SIGINT (Ctrl-C) or SIGTERM (`kill`, a scheduler stopping it): it exits, its
flow run is closed (`Crashed`), and every process it started (the temporary Prefect server, the round's Ray: GCS,
raylet, agents, workers) is gone. Before the fix, a Ctrl-C left Ray's dashboard agent running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.name()} {' '.join(p.cmdline())}"
    except psutil.Error:  # gone meanwhile
        return ""


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture()
def run_env(tmp_path, profile):
    data = profile.model_dump(mode="json")
    data["training"].update(steps=3, batch_size=4, warmup_steps=1)
    data["storage"] = {"runs_dir": str(tmp_path / "runs")}
    data["registry"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "model_name": "jf-interrupt"}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "RAY_ADDRESS"))}
    env |= {"JF_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    return path, env


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_leaves_no_process_behind(run_env, sig):
    path, env = run_env
    proc = subprocess.Popen(
        [sys.executable, "-m", "jf_cli.main", "run", "--profile", str(path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    me = psutil.Process(proc.pid)
    started: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:  # until the round's Ray is up
            for child in me.children(recursive=True):
                started.setdefault(child.pid, child)
            seen = [describe(p) for p in started.values()]
            if any(s.startswith("raylet") for s in seen) and any("prefect" in s for s in seen):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert any(describe(p).startswith("raylet") for p in started.values()), "the round never started its Ray"
        time.sleep(2)
        for child in me.children(recursive=True):
            started.setdefault(child.pid, child)
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = proc.stdout.read()
    assert code != 0 and "Crashed" in output, output[-3000:]  # the flow run was closed on the way out
    deadline = time.monotonic() + 10  # a moment for the last children to be reaped
    while (left := [p for p in started.values() if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [(p.pid, describe(p)[:120]) for p in left]
