"""The Ray this project starts listens on 127.0.0.1 only and refuses drivers without its token; joining a cluster
needs token auth. Checked from the OS's socket table while a round's stages run, the way the flow runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from jacobi_forcing.infra import ray_cluster
from jacobi_forcing.infra.ray_cluster import RayAuthError, check_join_auth, is_loopback, ray_session
from tests.infra.sockets import SocketWatch

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _default_sigint() -> None:
    """In the child before it execs: SIGINT at its default, so Python installs its KeyboardInterrupt handler as it
    does for a command started from a shell. An ignored SIGINT is inherited across exec, and a test worker's
    disposition depends on what ran in it before (seen: the SIGINT cases exiting 0 under pytest-xdist)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a fresh process: no Ray settings inherited, a HOME of its own (to see ~/.ray writes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "HOME": str(home)}


ROUND_SCRIPT = """
import json, sys
from jf_core.config import JFTrainConfig, Profile
from jacobi_forcing.tasks.trajectories import generate_trajectories
from jf_core.round.paths import RoundPaths
from jf_core.round.stages import stage_pack, stage_trajectories
from jacobi_forcing.tasks.train_distributed import train_distributed

profile = Profile.model_validate(json.loads(open(sys.argv[1]).read()))
paths = RoundPaths(__import__("pathlib").Path(sys.argv[2]))
collect = lambda prof, out: generate_trajectories(prof, out, progress=False)
trajectories = stage_trajectories(profile, profile.model.path, paths, collect=collect)  # the flow's stage
profile = profile.model_copy(
    update={
        "training": JFTrainConfig(steps=3, batch_size=2, warmup_steps=1, strategy="fsdp2"),
        "compute": profile.compute.model_copy(update={"train_workers": 2}),
    }
)
stage_pack(profile, paths, trajectories)
train_distributed(profile, paths, profile.model.path)  # the flow's train stage for strategy fsdp2
print("ROUND-OK")
"""


def test_round_ray_and_ray_train_listen_on_loopback_only(profile, tmp_path):
    """A round's trajectory stage and Ray Train, each starting its own Ray in a fresh process as the flow's do."""
    data = profile.model_dump(mode="json")
    data["compute"]["trajectory_pool"] = "ray"  # the actor pool's Ray, whatever JF_CPUS resolves `auto` to
    (tmp_path / "profile.json").write_text(json.dumps(data))
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", ROUND_SCRIPT, str(tmp_path / "profile.json"), str(tmp_path / "round")],
        env=_clean_env(home),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with SocketWatch(proc.pid) as watch:
        out, _ = proc.communicate(timeout=500)
    assert proc.returncode == 0 and "ROUND-OK" in out, out[-4000:]
    names = {name for name, _, _ in watch.seen}
    # The watch saw the Ray it is about: its servers, the trajectory actors and Ray Train's workers (whose
    # rendezvous store is the socket torch would otherwise bind to every interface).
    assert {"gcs_server", "raylet"} <= names, names
    assert any("TrajectoryWorker" in n for n in names), names
    assert any("RayTrainWorker" in n for n in names), names
    assert watch.exposed() == [], watch.exposed()
    assert not (home / ".ray").exists(), "a private Ray must not write ~/.ray"


PROBE = """
import pathlib, sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as err:
    print("REFUSED", type(err).__name__)
    sys.exit(0)
ray.get(ray.remote(lambda p: pathlib.Path(p).write_text("ran")).remote(sys.argv[2]), timeout=60)
print("RAN")
"""


def test_private_ray_refuses_drivers_without_its_token(tmp_path):
    """...and the session leaves the process as it found it: its Ray settings and its SIGTERM handler."""
    import ray

    before = {k: os.environ.get(k) for k in ray_cluster._SETTINGS}

    def ours(signum, frame):  # the caller's SIGTERM handler (`jf run` unwinds SIGTERM like Ctrl-C)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        with ray_session(num_cpus=1) as session:
            inside = signal.getsignal(signal.SIGTERM)  # ray.init installed its own; the session put ours back,
            assert getattr(inside, "handler", None) is ours  # wrapped to be safe inside Ray's signal check
            results = _probe_drivers(session, tmp_path)
            # Its workers run at this process's priority, not Ray's default nice 15 (infra/ray_cluster.py).
            assert ray.get(ray.remote(lambda: os.nice(0)).remote(), timeout=60) == os.nice(0)
        assert signal.getsignal(signal.SIGTERM) is ours, "the caller's SIGTERM handler is back"
    finally:
        signal.signal(signal.SIGTERM, previous)
    for name in ("no auth", "wrong token"):
        output, marker = results[name]
        assert "REFUSED" in output and not marker.exists(), (name, output)
    output, marker = results["the token"]
    assert "RAN" in output and marker.read_text() == "ran", output
    assert not session.token_path.exists(), "the token goes with the Ray it keyed"
    assert {k: os.environ.get(k) for k in ray_cluster._SETTINGS} == before


def _probe_drivers(session, tmp_path: Path) -> dict[str, tuple[str, Path]]:
    """Three drivers try `session`'s Ray: without auth, with a wrong token, with its token."""
    assert session.private and session.loopback and is_loopback(session.address)
    assert (session.token_path.stat().st_mode & 0o777) == 0o600
    token = session.token_path.read_text()
    # Each driver runs on this machine in local-only mode, as one aiming at the loopback ports would.
    local = {ray_cluster.LOCAL_ONLY: "0"}
    drivers = {
        "no auth": {**local, "RAY_AUTH_MODE": "disabled"},
        "wrong token": {**local, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * len(token)},
        "the token": {**local, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
    }

    def probe(name: str) -> tuple[str, Path]:
        home = tmp_path / name.replace(" ", "-")
        home.mkdir()
        env = {**_clean_env(home), **drivers[name]}
        out = subprocess.run(
            [sys.executable, "-c", PROBE, session.address, str(home / "marker")],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        return out.stdout + out.stderr[-2000:], home / "marker"

    with ThreadPoolExecutor(len(drivers)) as pool:  # refusals take Ray's connect timeout: wait for them together
        return dict(zip(drivers, pool.map(probe, drivers), strict=True))


SIGTERM_SCRIPT = """
import os, signal, sys, threading, time
from jacobi_forcing.infra.ray_cluster import ray_session

def interrupt(signum, frame):  # what `jf run` installs: SIGTERM unwinds like Ctrl-C
    raise KeyboardInterrupt("SIGTERM")

signal.signal(signal.SIGTERM, interrupt)
try:
    with ray_session(num_cpus=1):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        time.sleep(60)
except KeyboardInterrupt as err:
    print("UNWOUND", err, flush=True)
    time.sleep(5)  # a cleanup slower than abseil's 3-second abort timer: closing the flow run, stopping a server
    print("CLEANED UP", flush=True)
    sys.exit(3)
"""


def test_a_sigterm_inside_a_ray_session_unwinds_through_the_callers_handler_and_is_not_aborted(tmp_path):
    """The driver's core worker puts abseil's failure-signal handler in front of SIGTERM, and that handler arms a
    3-second SIGABRT: a `kill` during a Ray stage aborted `jf run` mid-cleanup (exit -6) and orphaned its server."""
    out = subprocess.run(
        [sys.executable, "-c", SIGTERM_SCRIPT], cwd=REPO, env=_clean_env(tmp_path), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "UNWOUND SIGTERM" in out.stdout and "CLEANED UP" in out.stdout
    assert "SIGTERM received" not in out.stderr  # abseil never saw it


LOST_SIGNAL_SCRIPT = """
import os, signal, sys, time
import ray
from jacobi_forcing.infra.ray_cluster import ray_session

sig, fate = signal.Signals[sys.argv[1]], sys.argv[2]
real_init = ray.init

def init(**kwargs):
    # A signal whose Python handler runs inside a C function of ray.init: the function either fails with
    # SystemError (seen in CI: Prefect retried the task and `jf run` finished its round after a SIGTERM) or drops
    # the handler's exception and goes on.
    try:
        os.kill(os.getpid(), sig)
        time.sleep(1)
    except BaseException as err:
        if fate == "mangled":
            raise SystemError("<built-in method __new__> returned a result with an exception set") from err
    return real_init(**kwargs)

ray.init = init

def interrupt(signum, frame):  # what `jf run` installs: SIGTERM unwinds like Ctrl-C
    raise KeyboardInterrupt("SIGTERM")

signal.signal(signal.SIGTERM, interrupt)
try:
    with ray_session(num_cpus=1):
        print("RAY STAGE RAN", flush=True)
except KeyboardInterrupt as err:
    print("UNWOUND", err, "from", type(err.__cause__).__name__, flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("fate", ["mangled", "swallowed"])
def test_a_signal_whose_exception_ray_init_loses_still_unwinds(tmp_path, sig, fate):
    """Which signals arrived is read from Python's wakeup fd, not from the exception that reached us."""
    out = subprocess.run(
        [sys.executable, "-c", LOST_SIGNAL_SCRIPT, sig, fate], cwd=REPO, env=_clean_env(tmp_path),
        capture_output=True, text=True, timeout=300, preexec_fn=_default_sigint,
    )  # fmt: skip
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "RAY STAGE RAN" not in out.stdout
    assert ("UNWOUND SIGTERM" if sig == "SIGTERM" else "UNWOUND signal SIGINT") in out.stdout, out.stdout
    if fate == "mangled":
        assert "from SystemError" in out.stdout


PREFECT_SIGTERM_SCRIPT = """
import os, signal, sys, threading, time
import ray
from prefect.exceptions import TerminationSignal
from prefect.utilities.engine import capture_sigterm
from jacobi_forcing.infra.ray_cluster import ray_session

try:
    with capture_sigterm():  # what Prefect's flow engine wraps a flow run in: SIGTERM raises TerminationSignal
        with ray_session(num_cpus=1):
            nap = ray.remote(lambda seconds: time.sleep(seconds))
            ray.get(nap.remote(0))
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            ray.get(nap.remote(60))  # the signal lands inside Ray's own signal check
            print("RAY STAGE RAN", flush=True)
except TerminationSignal as err:
    print("TERMINATION SIGNAL", err.signal, flush=True)
    sys.exit(3)
except Exception as err:
    print("ORDINARY EXCEPTION", type(err).__name__, err, flush=True)  # what Prefect would retry
    sys.exit(4)
"""


def test_a_sigterm_inside_ray_get_reaches_prefect_as_its_termination_signal(tmp_path):
    """Ray's signal check passes on only KeyboardInterrupt and SystemExit; Prefect's TerminationSignal came out of
    `ray.get` as a SystemError, an ordinary exception that Prefect retried: `jf run` ignored its SIGTERM."""
    env = {**_clean_env(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    out = subprocess.run(
        [sys.executable, "-c", PREFECT_SIGTERM_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    # capture_sigterm then passes the signal on to the handler it replaced (Python's default: die by SIGTERM).
    assert out.returncode in (3, -signal.SIGTERM), (out.returncode, out.stdout, out.stderr[-2000:])
    assert "ORDINARY EXCEPTION" not in out.stdout and "RAY STAGE RAN" not in out.stdout, out.stdout


def test_joining_a_cluster_needs_token_auth(monkeypatch, tmp_path):
    for name in ray_cluster._SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(RayAuthError, match="RAY_AUTH_MODE=disabled"):
        check_join_auth("10.0.0.10:6379")
    monkeypatch.delenv("RAY_AUTH_MODE")
    with pytest.raises(RayAuthError, match=r"no Ray auth token .* RAY_AUTH_TOKEN_PATH"):
        check_join_auth("10.0.0.10:6379")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "empty"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(RayAuthError, match="missing or empty"):
        check_join_auth("10.0.0.10:6379")
    (tmp_path / "token").write_text("secret")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    check_join_auth("10.0.0.10:6379")
    # Refused before any connection is tried, with the settings put back.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(RayAuthError), ray_session("10.0.0.10:6379"):
        pass
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_loopback_addresses():
    assert all(map(is_loopback, ["127.0.0.1:6379", "localhost:6379", "ray://127.0.0.1:10001", "[::1]:6379"]))
    assert not any(map(is_loopback, ["10.0.0.10:6379", "jf-ray-head-svc:6379", "ray://head:10001", "auto"]))


def test_stack_ray_head_loopback_token_and_stopped_alone(tmp_path, monkeypatch):
    """`jf stack up --ray`'s head: loopback only, joined with the stack's token, refused without it, and `down`
    stops this Ray only."""
    from jacobi_forcing.infra import stack

    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    cfg = stack.StackConfig(ray=True, ray_port=stack.free_port())
    stack.stack_dir().mkdir(parents=True)
    env = stack.client_env(cfg)
    started = time.monotonic()
    stack._start_ray(cfg, env, timeout=120)
    try:
        pid = int((stack.stack_dir() / "ray-head.pid").read_text())
        token = stack.ray_token_path()
        assert (token.stat().st_mode & 0o777) == 0o600
        with SocketWatch(pid) as watch:
            client = {**_clean_env(tmp_path), **{k: v for k, v in env.items() if k.startswith("RAY_")}}
            joined = subprocess.run(
                [sys.executable, "-c", PROBE, env["RAY_ADDRESS"], str(tmp_path / "marker")],
                env=client,
                capture_output=True,
                text=True,
                timeout=180,
            )
            time.sleep(1)
            head = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            head_names = {p.name() for p in head}
        assert "RAN" in joined.stdout, joined.stdout + joined.stderr[-3000:]
        assert {"gcs_server", "raylet"} <= {n for n, _, _ in watch.seen} and watch.exposed() == [], watch.seen
        assert any(port == cfg.ray_port for _, _, port in watch.seen)
        # A private session never joins a Ray that `ray start` left running here (plain ray.init() would).
        with ray_session(num_cpus=1) as private:
            assert private.private and private.address != env["RAY_ADDRESS"]
        # Our own join goes through the same checks as any: with the stack's env it joins the head.
        for key, value in env.items():
            if key.startswith("RAY_"):
                monkeypatch.setenv(key, value)
        with ray_session() as session:
            assert not session.private and session.loopback
    finally:
        stopped = stack.down()
    assert "ray-head" in stopped and not token.exists()
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    assert not pointer.exists() or pointer.read_text().strip() != env["RAY_ADDRESS"]

    def survivors() -> list:
        return [p for p in head if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + 15
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert {"gcs_server", "raylet"} <= head_names and survivors() == [], survivors()
    # Stopped in Ray's own order (the head's SIGTERM handler drains the node through the GCS, then stops the raylet
    # before the GCS), not by the SIGKILL after `down`'s timeout: a SIGTERM to the whole group killed the GCS first.
    assert "Local node finished draining" in (stack.stack_dir() / "ray-head.log").read_text()
    assert time.monotonic() - started < 300
