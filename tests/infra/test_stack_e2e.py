"""End to end on real servers: `jf stack up --ray` (free ports) -> `prefect deploy --all` -> a round whose worker
is killed mid-trajectories with everything it started -> with the worker started again at once, `prefect deployment
run jf-round/tiny --watch` on the embedded model completes, its trajectory actors on the stack's Ray (joined with the
stack's token) -> the MLflow registry holds a version with its metrics and plots and `champion`, whose event starts
the `jf-benchmark/champion` deployment (a cancel ends that run `Cancelled`) -> meanwhile the killed run has ended
`Crashed` (the stack's heartbeat automation), and the next round, the same parameters with a gate made to fail,
closes its MLflow runs `FAILED`, reuses every stage and leaves `champion` alone; the scheduled deployment has
scheduled runs, and one started now trains from the champion resolved out of the registry; the README's
registry-consumer snippet works as written; `jf serve models:/jf-tiny@champion` on the stack's Ray answers the
official `openai` client (plain and streamed) with the champion's greedy AR text and stops with everything it
started; every socket the stack's processes (and the flow runs they start) listened on was on 127.0.0.1; `down`
stops everything."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import readme
from tests.infra.sockets import SocketWatch
from tests.small_round import LENIENT_GATE, SMALL_ROUND

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory):
    from jacobi_forcing.infra import stack
    from jf_core.toy.bootstrap import embedded_model

    model = embedded_model()  # the shipped weights, copied into the cache once
    home = tmp_path_factory.mktemp("jf_home")
    (home / "models").mkdir()
    (home / "models" / model.name).symlink_to(model)
    saved = os.environ.get("JF_HOME")
    os.environ["JF_HOME"] = str(home)
    cfg = stack.StackConfig(
        prefect_port=stack.free_port(),
        mlflow_port=stack.free_port(),
        ray=True,
        ray_port=stack.free_port(),
        project_dir=str(REPO),
    )
    watches: dict[str, SocketWatch] = {}
    try:
        info = stack.up(cfg, timeout=180)
        # The READMEs' `jf stack status`, as written (the stack of this $JF_HOME): every service up and healthy.
        jf = str(Path(sys.executable).parent / "jf")
        said = subprocess.run([jf, "stack", "status"], cwd=REPO, capture_output=True, text=True, timeout=60)
        services = json.loads(said.stdout)["services"]
        assert all(s["running"] for s in services.values()), services
        assert services["prefect-server"]["healthy"] and services["mlflow-server"]["healthy"], services
        for name in stack.SERVICES:  # each service's whole process tree, the worker's flow runs included
            watches[name] = SocketWatch(int((stack.stack_dir() / f"{name}.pid").read_text()), every=0.5).__enter__()
        # Only the stack's MLflow and Ray: nothing an earlier in-process test exported may leak into clients.
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_"))}
        yield {**clean, **info["env"]}
        for watch in watches.values():
            watch.__exit__(None, None, None)
        ports = {name: {port for _, _, port in w.seen} for name, w in watches.items()}
        assert cfg.prefect_port in ports["prefect-server"] and cfg.mlflow_port in ports["mlflow-server"], ports
        assert cfg.ray_port in ports["ray-head"], ports
        exposed = {name: w.exposed() for name, w in watches.items() if w.exposed()}
        assert not exposed, f"listening beyond 127.0.0.1: {exposed}"
    finally:
        for watch in watches.values():
            watch.__exit__(None, None, None)
        stopped = stack.down()
        pids = [int(p.read_text()) for p in stack.stack_dir().glob("*.pid") if p.read_text().strip().isdigit()]
        if saved is None:
            os.environ.pop("JF_HOME", None)
        else:
            os.environ["JF_HOME"] = saved
        assert {"prefect-server", "mlflow-server", "ray-head"} <= set(stopped) and not pids


def _prefect(env, *args, timeout=1200) -> subprocess.CompletedProcess:
    prefect = str(Path(sys.executable).parent / "prefect")
    return subprocess.run([prefect, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _run_deployment(env, params: dict, deployment: str = "jf-round/tiny") -> str:
    out = _prefect(
        env, "deployment", "run", deployment, "--params", json.dumps(params), "--watch", "--watch-timeout", "1200"
    )
    assert out.returncode == 0 and "Completed" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    return re.search(r"UUID: ([0-9a-f-]{36})", out.stdout).group(1)


def _api(env, coro_fn):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def go():
        async with get_client() as client:
            return await coro_fn(client)

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        return asyncio.run(go())


def _task_states(env, flow_run_id: str) -> dict[str, str]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read(client):
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        return {r.name: r.state.name for r in runs if r.state is not None}  # a task run is created before its state

    return _api(env, read)


def test_stack_deploy_run_register_gate_schedule(stack_env):
    from mlflow import MlflowClient

    deploy = _prefect(stack_env, "--no-prompt", "deploy", "--all", timeout=300)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]

    # A lenient gate for the first run (tests/small_round.py), an impossible one after.
    lenient = {**SMALL_ROUND, "registry": {"gate": LENIENT_GATE}}
    uri = stack_env["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri, uri)
    # The automation needs 90 s without a heartbeat to call the killed run crashed: the first round runs meanwhile.
    _a_killed_worker_leaves_running_mlflow_runs(stack_env, client, {"overrides": lenient})
    first = _run_deployment(stack_env, {"overrides": lenient})
    assert not any(s == "Reused" for s in _task_states(stack_env, first).values())  # the killed run finished none
    v1 = client.get_model_version_by_alias("jf-tiny", "champion")
    assert str(v1.version) == "1" and {
        "tpf",
        "tps",
        "accuracy",
        "train_block_size",
        "decode_block_size",
        "base_model",
    } <= set(v1.tags)
    run = client.get_run(v1.run_id)
    assert {"tpf", "tps", "accuracy", "speedup_vs_ar", "loss"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(v1.run_id, "plots")} == {
        "plots/loss_curves.png",
        "plots/tpf_per_round.png",
        "plots/acceptance_histogram.png",
    }
    _the_champion_event_started_its_benchmark_and_a_cancel_ends_it(stack_env)

    _the_killed_run_is_crashed(stack_env, client)
    failing = {**SMALL_ROUND, "registry": {"gate": {"max_accuracy_drop": -1.0}}}
    second = _run_deployment(stack_env, {"overrides": failing})
    _closed_by_the_rerun(client, second)
    states = _task_states(stack_env, second)
    for stage in ("trajectories", "pack", "train", "evaluate"):
        assert any(n.startswith(stage) and s == "Reused" for n, s in states.items()), states
    assert str(client.get_model_version_by_alias("jf-tiny", "champion").version) == "1"
    v2 = client.get_model_version_by_alias("jf-tiny", "challenger")
    assert str(v2.version) == "2" and v2.tags["gate"] == "failed"

    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    async def scheduled(client):
        return await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["retrain-tiny"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )

    deadline = time.monotonic() + 90
    while not (runs := _api(stack_env, scheduled)) and time.monotonic() < deadline:
        time.sleep(3)
    assert runs and runs[0].parameters["model"] == "models:/jf-tiny@champion"

    # What the schedule runs, started now: the round resolves the champion from the registry and trains on it (its
    # autotune, shown by the first round, left out, and smaller stages: what this run adds is where its model comes
    # from; at the first round's sizes it cost as much as that round, 106 s alone).
    evaluation = {
        **SMALL_ROUND["evaluation"],
        "num_prompts": 6,
        "tune": {**SMALL_ROUND["evaluation"]["tune"], "enabled": False},
    }
    small = {"prompts": {"limit": 16}, "training": {"steps": 10, "warmup_steps": 2}, "evaluation": evaluation}
    retrain = {**lenient, **small}
    _run_deployment(stack_env, {"overrides": retrain}, deployment="jf-round/retrain-tiny")
    v3 = client.get_model_version_by_alias("jf-tiny", "challenger")
    assert str(v3.version) == "3" and "jf-tiny-v1" in v3.tags["base_model"], v3.tags
    assert "embedded-qwen2" in v3.tags["lineage_base"], v3.tags  # the gate's base: the chain's original model

    out = subprocess.run(
        [sys.executable, "-c", readme.snippet("registry-consumer")], env=stack_env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "answer" in out.stdout  # the embedded task's answers end in "answer <number>"

    _serve_the_champion(stack_env)


KILLED: dict[str, object] = {}  # the killed flow run's id and its MLflow runs, for the rerun's checks


def _a_killed_worker_leaves_running_mlflow_runs(env, client, params: dict) -> None:
    """A machine lost mid-round: the worker and every process it started (the flow run's own process group too)
    SIGKILLed while the round collects trajectories, so nothing reports the end: its MLflow runs stay `RUNNING`. The
    worker is started again (`jf stack up` starts what is missing); the stack's automation marks the run `Crashed`
    once its heartbeats stop (`_the_killed_run_is_crashed`), and the round after that closes its MLflow runs
    `FAILED`."""
    import psutil

    from jacobi_forcing.infra import stack

    out = _prefect(env, "deployment", "run", "jf-round/tiny", "--params", json.dumps(params), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", out.stdout).group(1)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        states = _task_states(env, run_id)
        if any(n.startswith("trajectories") and s == "Running" for n, s in states.items()):
            break
        time.sleep(1)
    assert any(n.startswith("trajectories") and s == "Running" for n, s in states.items()), states
    experiment = client.get_experiment_by_name("jacobi-forcing").experiment_id
    mlflow_runs = client.search_runs([experiment], filter_string=f"tags.`prefect.flow_run_id` = '{run_id}'")
    assert {r.info.status for r in mlflow_runs} == {"RUNNING"} and len(mlflow_runs) == 2  # parent and round

    worker = psutil.Process(int((stack.stack_dir() / "prefect-worker.pid").read_text()))
    victims = [worker, *worker.children(recursive=True)]
    assert len(victims) > 1, "the worker has no flow-run process to lose"
    for proc in victims:
        proc.kill()
    psutil.wait_procs(victims, timeout=30)
    KILLED.update(run_id=run_id, mlflow_runs=[r.info.run_id for r in mlflow_runs], at=time.monotonic())
    info = json.loads((stack.stack_dir() / "stack.json").read_text())
    stack.up(stack.StackConfig(**info["config"]))  # the worker again; the servers are up and left as they are


def _the_killed_run_is_crashed(env, client) -> None:
    """The stack's automation marked the killed run `Crashed` ("no heartbeat"); no round has closed its MLflow runs
    yet (the round run meanwhile started before the crash was known)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import StateType

    from jacobi_forcing.infra import automations

    async def state(prefect):
        (run,) = await prefect.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[KILLED["run_id"]]))
        )
        return run.state

    deadline = KILLED["at"] + automations.HEARTBEAT_SECONDS + automations.MISSED_AFTER_SECONDS + 90
    while (now := _api(env, state)).type != StateType.CRASHED and time.monotonic() < deadline:
        time.sleep(3)
    assert now.type == StateType.CRASHED, now
    assert "no heartbeat" in now.message
    assert {client.get_run(r).info.status for r in KILLED["mlflow_runs"]} == {"RUNNING"}  # until a round reaps


def _closed_by_the_rerun(client, rerun_id: str) -> None:
    for mlflow_run in KILLED["mlflow_runs"]:
        run = client.get_run(mlflow_run)
        assert run.info.status == "FAILED", run.info
        assert run.data.tags["jf.closed_by"] == f"Prefect flow run {KILLED['run_id']} ended CRASHED"
    assert rerun_id != KILLED["run_id"]


def _the_champion_event_started_its_benchmark_and_a_cancel_ends_it(env) -> None:
    """The gate moved `champion`, so the registering task's event started `jf-benchmark/champion` (prefect.yaml's
    trigger) on this stack's worker. Once it runs it is cancelled, as `prefect flow-run cancel` does: the worker stops
    it and it ends `Cancelled`, not stuck `Cancelling`. (A full benchmark of the tiny profile would compete with the
    rest of this test, so the trigger is paused afterwards.)"""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType

    async def benchmark_runs(client):
        dep = await client.read_deployment_by_name("jf-benchmark/champion")
        runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
        return dep, runs

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        dep, runs = _api(env, benchmark_runs)
        if runs and runs[0].state.type == StateType.RUNNING:
            break
        time.sleep(2)
    assert len(runs) == 1 and runs[0].state.type == StateType.RUNNING, [(r.name, r.state) for r in runs]
    assert runs[0].parameters == {"profile": "tiny", "model": "models:/jf-tiny/1"}

    async def pause_trigger(client):
        for automation in await client.read_resource_related_automations(f"prefect.deployment.{dep.id}"):
            await client.pause_automation(automation.id)

    _api(env, pause_trigger)
    cancel = _prefect(env, "flow-run", "cancel", str(runs[0].id), timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = _api(env, lambda client: client.read_flow_run(runs[0].id)).state
        if state.type == StateType.CANCELLED:
            break
        time.sleep(2)
    assert state.type == StateType.CANCELLED, state


def _serve_the_champion(env) -> None:
    """`jf serve models:/jf-tiny@champion` as a user runs it beside the stack (it joins the stack's Ray with its
    token); the reference is greedy AR on the champion as MLflow itself downloads it, not through our resolver."""
    import openai
    import psutil

    from jf_core.decoding.ar import ar_decode
    from jf_core.models import load_model, stop_tokens
    from tests.infra.serving import spawn_jf_serve, wait_healthy

    # In a child with the stack's env: MLflow resolves models:/ through the registry URI, which follows
    # MLFLOW_TRACKING_URI there (setting it here would leak into later tests).
    fetch = "import mlflow; print(mlflow.artifacts.download_artifacts('models:/jf-tiny@champion'))"
    out = subprocess.run([sys.executable, "-c", fetch], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    local = Path(out.stdout.strip().splitlines()[-1])
    model, tok = load_model(str(local / "artifacts" / "checkpoint"), dtype="float32", device="cpu")

    def greedy(prompt: str, budget: int) -> str:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        out = ar_decode(model, [ids], max_new_tokens=budget, stop=stop_tokens(model, tok))
        return tok.decode(out.sequences[0], skip_special_tokens=True)

    proc, url = spawn_jf_serve(["models:/jf-tiny@champion"], env=env)
    try:
        wait_healthy(proc, url)
        tree = psutil.Process(proc.pid).children(recursive=True)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["jf-tiny"]
        prompt = "program: a=85; step -8; return f"
        out = client.completions.create(model="jf-tiny", prompt=prompt, max_tokens=48, temperature=0)
        assert out.choices[0].text == greedy(prompt, 48) and out.usage.completion_tokens > 0
        prompt = "program: x=9; step *2; step -1; return z"
        stream = client.completions.create(model="jf-tiny", prompt=prompt, max_tokens=48, stream=True)
        chunks = [c.text for event in stream for c in event.choices]
        assert "".join(chunks) == greedy(prompt, 48) and len([c for c in chunks if c]) > 1
        # The README's client snippet as written, but for the port (this server's is a free one): its completion,
        # stream and chat each print the champion's greedy text (the chat template hands it the user's program).
        snippet = readme.snippet("openai-client")
        out = subprocess.run(
            [sys.executable, "-c", snippet.replace("http://127.0.0.1:8000", url)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        asked = re.findall(r'"(program: [^"]+)".*?max_tokens=(\d+)', snippet, re.S)
        assert len(asked) == 3, asked
        for program, budget in asked:
            assert greedy(program, int(budget)) in out.stdout, (program, out.stdout)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    assert code == 0, proc.stdout.read()[-3000:]
    time.sleep(3)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "jf serve left processes"
