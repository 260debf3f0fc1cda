"""The local stack on 127.0.0.1: Prefect server (sqlite), the `jf-pool` process work pool and a worker, MLflow
server (sqlite + local artifacts), and optionally a Ray head (local-only, token auth: infra/ray_cluster.py).
`jf stack up|down|status`.

State lives under `<JF_HOME>/stack/`: one PID file and one log per service, `stack.json` (ports and URLs) and
`stack.env` (the variables clients need: `source` it, or let `jf` read it). Servers are started in their own
process groups, health-checked before `up` returns, and stopped group-wide (SIGTERM, then SIGKILL) by `down`.
Prefect's and MLflow's stores are the same ones local runs use ($JF_HOME/prefect, $JF_HOME/mlflow), so flows run
before the stack existed show up in its UIs.

Production: point both servers at PostgreSQL instead of sqlite (see infra/README.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jacobi_forcing.infra import automations, gpu_limit, ray_cluster, work_pools
from jf_core.paths import jf_home

POOL = "jf-pool"
WORKER_QUERY_SECONDS = 2
SERVICES = ("prefect-worker", "ray-head", "mlflow-server", "prefect-server")  # the order `down` stops them in
QUIET = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_ENABLE_TELEMETRY": "false",
    "DO_NOT_TRACK": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
}


@dataclass
class StackConfig:
    prefect_port: int = 4200
    mlflow_port: int = 5000
    ray: bool = False
    ray_port: int = 6379
    project_dir: str = field(default_factory=lambda: str(Path(__file__).resolve().parents[1]))

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"


def stack_dir() -> Path:
    return jf_home() / "stack"


def _bin(name: str) -> str:
    """The console script of this interpreter's environment (a venv need not be activated)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_token_path() -> Path:
    return stack_dir() / "ray_auth_token"


def client_env(cfg: StackConfig) -> dict[str, str]:
    """What a client of the stack (a shell, the worker, a test) needs in its environment."""
    ray = {
        "RAY_ADDRESS": f"127.0.0.1:{cfg.ray_port}",
        ray_cluster.LOCAL_ONLY: "0",  # a driver must be on loopback too to reach a loopback-only Ray
        ray_cluster.AUTH_MODE: "token",
        ray_cluster.AUTH_TOKEN_PATH: str(ray_token_path()),
    }
    return {
        **QUIET,
        "PREFECT_API_URL": cfg.prefect_api,
        "PREFECT_HOME": str(jf_home() / "prefect"),
        "MLFLOW_TRACKING_URI": cfg.mlflow_uri,
        "JF_HOME": str(jf_home()),
        **(ray if cfg.ray else {}),
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _pidfile(name: str) -> Path:
    return stack_dir() / f"{name}.pid"


def _spawn(name: str, cmd: list[str], env: dict[str, str], cwd: str | None = None) -> int:
    log = open(stack_dir() / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    # The stack's services talk to the stack's MLflow only, whatever MLflow settings the caller's shell had, and to
    # the stack's Ray with its token (an inherited RAY_AUTH_TOKEN would outrank the token file).
    drop = ("MLFLOW_",) + ((ray_cluster.AUTH_TOKEN,) if ray_cluster.AUTH_TOKEN_PATH in env else ())
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    proc = subprocess.Popen(
        cmd, env={**inherited, **env}, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    _pidfile(name).write_text(str(proc.pid))
    return proc.pid


def _wait(name: str, url: str, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _healthy(url):
            return
        if not _alive(pid):
            break
        time.sleep(0.5)
    tail = (stack_dir() / f"{name}.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{name} did not become healthy at {url} within {timeout:.0f} s; log tail:\n{tail}")


def up(cfg: StackConfig, *, timeout: float = 120.0) -> dict:
    """Start what is not running; return the stack description (also written to stack.json)."""
    stack_dir().mkdir(parents=True, exist_ok=True)
    (jf_home() / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    env = client_env(cfg)
    started: list[tuple[str, str, int]] = []
    if not _running("prefect-server"):
        server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
        cmd = [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(cfg.prefect_port)]
        started.append(("prefect-server", f"{cfg.prefect_api}/health", _spawn("prefect-server", cmd, server_env)))
    if not _running("mlflow-server"):
        db = jf_home() / "mlflow" / "mlflow.db"
        cmd = [
            _bin("mlflow"), "server",
            "--backend-store-uri", f"sqlite:///{db}",
            "--artifacts-destination", str(jf_home() / "mlflow" / "artifacts"),
            "--host", "127.0.0.1", "--port", str(cfg.mlflow_port), "--workers", "1",
        ]  # fmt: skip
        started.append(("mlflow-server", f"{cfg.mlflow_uri}/health", _spawn("mlflow-server", cmd, env)))
    for name, url, pid in started:  # started together, waited for together: the two boots overlap
        _wait(name, url, pid, timeout)
    _create_pool(env)
    automations.install(cfg.prefect_api)  # flow runs whose process died are marked Crashed
    gpu_limit.ensure(cfg.prefect_api)  # GPU stages of rounds take its slots (tasks/gpu_slots.py)
    work_pools.ensure(cfg.prefect_api)  # the GPU pools the real profiles' deployments run on (no worker here)
    if cfg.ray and not _running("ray-head"):
        _start_ray(cfg, env, timeout)  # before the worker, whose flows join it
    if not _running("prefect-worker"):
        cmd = [_bin("prefect"), "worker", "start", "--pool", POOL, "--type", "process"]
        worker = {
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(automations.HEARTBEAT_SECONDS),  # its flow runs'
            # One worker on one machine: asking every 2 s (Prefect's default is 10) starts a run within 2 s of
            # `prefect deployment run`, at a load the local server does not notice.
            "PREFECT_WORKER_QUERY_SECONDS": str(WORKER_QUERY_SECONDS),
        }
        _spawn("prefect-worker", cmd, {**env, **worker}, cwd=cfg.project_dir)
    info = {"config": asdict(cfg), "env": env, "ui": {"prefect": cfg.prefect_api[:-4], "mlflow": cfg.mlflow_uri}}
    (stack_dir() / "stack.json").write_text(json.dumps(info, indent=2))
    unset = f"unset {ray_cluster.AUTH_TOKEN}\n" if cfg.ray else ""  # the stack's token file must win
    (stack_dir() / "stack.env").write_text(unset + "".join(f"export {k}={v}\n" for k, v in env.items()))
    return info


def _create_pool(env: dict[str, str]) -> None:
    inspect = subprocess.run(
        [_bin("prefect"), "work-pool", "inspect", POOL], env={**os.environ, **env}, capture_output=True, text=True
    )
    if inspect.returncode == 0:
        return
    subprocess.run(
        [_bin("prefect"), "work-pool", "create", POOL, "--type", "process"],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    )


def _start_ray(cfg: StackConfig, env: dict[str, str], timeout: float) -> None:
    """A Ray head on 127.0.0.1 only (Ray's local-only mode: no other node can join) with token auth, under a fresh
    token that `stack.env` points clients at. `--block` keeps it in its own process group, so `down` stops exactly
    this Ray (`ray stop` would stop every Ray of this user on the machine)."""
    ray_token_path().unlink(missing_ok=True)
    ray_cluster.write_token(ray_token_path())
    head_env = {**env, **{k: v for k, v in ray_cluster.private_env(ray_token_path()).items() if v is not None}}
    cmd = [
        _bin("ray"), "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1", "--port", str(cfg.ray_port),
        "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    pid = _spawn("ray-head", cmd, {k: v for k, v in head_env.items() if k != "RAY_ADDRESS"})
    (stack_dir() / "ray-head.address").write_text(f"127.0.0.1:{cfg.ray_port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", cfg.ray_port), timeout=1):
            return
        time.sleep(0.5)
    tail = (stack_dir() / "ray-head.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the Ray head did not listen on 127.0.0.1:{cfg.ray_port} within {timeout:.0f} s:\n{tail}")


def _running(name: str) -> bool:
    pid = _read_pid(name)
    return pid is not None and _alive(pid)


def _read_pid(name: str) -> int | None:
    path = _pidfile(name)
    if not path.is_file():
        return None
    text = path.read_text().strip()
    return int(text) if text.isdigit() else None


def down(*, timeout: float = 20.0) -> list[str]:
    """Stop every service of the stack (the worker first, so it cannot pick up runs meanwhile)."""
    stopped = []
    for name in SERVICES:
        pid = _read_pid(name)
        if pid is not None and _alive(pid):
            _stop_group(pid, timeout, leader_only=name == "ray-head")
            stopped.append(name)
        _pidfile(name).unlink(missing_ok=True)
    ray_token_path().unlink(missing_ok=True)
    _forget_ray_head()
    return stopped


def _forget_ray_head() -> None:
    """Remove Ray's pointer to the head we stopped (`ray stop` would), so no later `ray.init()` tries to join it."""
    ours = stack_dir() / "ray-head.address"
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    with contextlib.suppress(OSError):
        if pointer.read_text().strip() == ours.read_text().strip():
            pointer.unlink()
    ours.unlink(missing_ok=True)


def _stop_group(pid: int, timeout: float, *, leader_only: bool = False) -> None:
    """SIGTERM, and SIGKILL to the whole group if its leader outlives `timeout`. `leader_only`: the SIGTERM goes to
    the leader alone, which stops its group in its own order: `ray start --block` drains its node through the GCS,
    then stops the raylet before the GCS. SIGTERM to the whole group killed the GCS first, so the drain and the
    autoscaler's monitor waited on it until the SIGKILL, 20 s later (2 s this way, 2026-12-05)."""
    try:
        if leader_only:
            os.kill(pid, signal.SIGTERM)
        else:
            os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
        with contextlib.suppress(ChildProcessError):  # reap our own child when `up` ran in this process (tests)
            os.waitpid(pid, os.WNOHANG)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def status() -> dict:
    info_path = stack_dir() / "stack.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else None
    services = {}
    for name in SERVICES:
        pid = _read_pid(name)
        services[name] = {"pid": pid, "running": pid is not None and _alive(pid)}
    if info is not None:
        cfg = StackConfig(**info["config"])
        services["prefect-server"]["healthy"] = _healthy(f"{cfg.prefect_api}/health")
        services["mlflow-server"]["healthy"] = _healthy(f"{cfg.mlflow_uri}/health")
    return {"services": services, "stack": info}
