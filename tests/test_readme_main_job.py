"""The README's main job as written, then what the README says to do with its result, in a fresh $JF_HOME and
nothing else: `.venv/bin/jf run` (sizes reduced through documented `--set` flags; the full size is the README's
29 minutes) exits 0 with a progress line from every stage and no warning, and prints the tracking URI to export; with
only that exported, the registry-consumer snippet loads `models:/jf-tiny@champion` and answers, and `mlflow models
serve` with the README's `curl` answers the same text over HTTP (both with their port replaced by a free one)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from jacobi_forcing.infra.stack import free_port
from tests.processes import stop_group, wait_for
from tests.readme import ROOT, lines_with, snippet
from tests.small_round import LENIENT_GATE, SMALL_ROUND, as_sets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

# The small round (tests/small_round.py) with a gate that passes it: the README's snippets need a champion.
SMALL = as_sets({**SMALL_ROUND, "registry": {"gate": LENIENT_GATE}})
# What each stage says while it works (a line of its own in the console, from the flow's logger), as a pattern.
PROGRESS = {
    "model": r"starting model embedded",
    "trajectories": r"trajectory shards: \d+/\d+",
    "training": r"step 0/40: ",
    "tune": r"tuning \d+ decode configs on 4 prompts: rung 1/\d: \d+ configs, run 1/1",
    "evaluation": r"CLLM model: quality: ",
    "registry": r"registry: jf-tiny version 1, gate passed: now champion",
}
# A line a user would take for trouble: Python's warnings (with their source line), tracebacks, raw colour codes,
# and Prefect's warning and error levels.
ALARMING = re.compile(r"Warning|warnings\.warn|Traceback|\x1b\[|\|\s*(ERROR|WARNING|CRITICAL)\s*\|")


def with_port(line: str, old: int, new: int) -> str:
    replaced = re.sub(rf"(?<=[ :]){old}\b", str(new), line)
    assert replaced != line, line
    return replaced


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The main job's console output and the environment a reader has after it: a fresh $JF_HOME holding only the
    embedded model (the session's cached bootstrap), and MLFLOW_TRACKING_URI exported as `jf run` said."""
    from jf_core.toy.bootstrap import embedded_model

    model = embedded_model()
    home = tmp_path_factory.mktemp("jf_home")
    (home / "models").mkdir()
    (home / "models" / model.name).symlink_to(model)
    command = lines_with("jf run")[0].split("&&")[-1].strip()  # the first screen's; after the setup, which CI ran
    assert command == ".venv/bin/jf run", command
    argv = shlex.split(command) + [a for k, v in SMALL.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RAY_"))}
    env["JF_HOME"] = str(home)
    done = subprocess.run(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1100
    )
    console = done.stdout  # as a terminal shows it: both streams in order
    (home / "console.log").write_text(console)  # kept with the test's temporary files, to read when it fails
    assert done.returncode == 0, console[-5000:]
    export = re.search(r"export MLFLOW_TRACKING_URI=(\S+)", console)
    assert export, console[-3000:]
    workdir = tmp_path_factory.mktemp("reader")  # not the repository: a stray ./mlflow.db would show here
    return console, {**env, "MLFLOW_TRACKING_URI": export.group(1)}, workdir


def test_the_main_job_shows_every_stage_and_no_warning(main_job):
    console, _, _ = main_job
    missing = [stage for stage, pattern in PROGRESS.items() if not re.search(pattern, console)]
    assert not missing, f"no progress from {missing}:\n{console[-5000:]}"
    # One warning is actionable and may be right on a busy machine: training's thread count against the free CPUs.
    lines = [line for line in console.splitlines() if "other processes are using" not in line]
    alarming = [line for line in lines if ALARMING.search(line)]
    assert not alarming, "\n".join(alarming[:20])
    # Progress bars of work that took seconds (transformers' loads and checkpoint writes, MLflow's artifact copies)
    # left two lines each, dozens per round, in place of the stage's own progress lines.
    instant = [line for line in console.splitlines() if re.search(r"\d+/\d+ \[00:0\d<", line)]
    assert not instant, "\n".join(instant[:20])


def test_the_registry_snippet_works_after_jf_run_alone(main_job):
    _, env, workdir = main_job
    out = subprocess.run(
        [sys.executable, "-c", snippet("registry-consumer")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The champion answered in the task's form. Whether it is right (45) is the round's evaluation's figure: the
    # embedded model trained in 84 s answers 45 on one CPU and 44 on another (an Intel Xeon, 2026-11-30).
    assert re.search(r"answer \d+", out.stdout), out.stdout
    assert not list(workdir.iterdir()), list(workdir.iterdir())  # nothing created where the reader stood


def test_mlflow_models_serve_and_the_curl_as_written(main_job, tmp_path):
    _, env, _ = main_job
    port = free_port()
    # Run from the repository root, as the README's $PWD/.venv assumes; the curl's continuation is joined.
    serve = with_port(lines_with("mlflow models serve")[0], 5001, port)
    curl = with_port(lines_with("/invocations")[0], 5001, port)
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            ["bash", "-c", serve], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(f"http://127.0.0.1:{port}/ping", server, log, timeout=240)
        answer = subprocess.run(["bash", "-c", curl], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert answer.returncode == 0, answer.stderr
        assert re.search(r"answer \d+", json.loads(answer.stdout)["predictions"][0]), answer.stdout
    finally:
        stop_group(server, timeout=30)
