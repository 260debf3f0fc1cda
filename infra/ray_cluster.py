"""How this project starts or joins Ray, without opening it to anyone else.

An unauthenticated Ray port is remote code execution: any driver that reaches it may run Python on the machine.

**A private Ray** (a round's trajectory actors, Ray Train on one machine, `jf stack up --ray`) runs in Ray's
local-only mode, so every process it starts (GCS, raylet and object manager, workers, agents) listens on 127.0.0.1
only, and with Ray's token authentication on, keyed by a fresh random token per Ray instance in a 0600 file of a
private temporary directory. Loopback keeps other machines out; the token keeps out the other users of this machine
(a shared GPU node), whom loopback does not. Nothing is written under ~/.ray (Ray's default token path), and the
process's previous Ray settings are restored when the session ends. Ray Train on a private Ray rendezvouses through
a TCPStore bound to 127.0.0.1 (`LoopbackTorchConfig`): torch's own binds every interface.

**Joining a cluster** (`compute.ray_address` or RAY_ADDRESS) always uses token authentication: the cluster's token
comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (Ray's own order); RAY_AUTH_MODE=disabled is
refused. infra/README.md says how a cluster gets its token.

Ray reads its auth mode and local-only switch when it is imported, and a process keeps the first value it saw;
`_apply` refreshes both the way `ray.init` itself does, so a session works whether or not `ray` was imported before.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jf_core import pins

pins.require("ray")  # the private names this module and serve_app.py use (jf_core/pins.py), refused by version

LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's local-only mode (node IP 127.0.0.1, no worker nodes)
AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
# Ray starts its workers at nice 15 so they never starve its own daemons on a shared node. In a Ray of ours the workers
# are the job (trajectory actors, Ray Train, Serve replicas and proxy): beside any other busy process a nice-15 worker
# got a few percent of a CPU (a trajectory actor's model load took 3 min instead of 10 s beside three busy loops), so
# they run at the priority of the process that started them. Ray's job manager does the same for its drivers.
WORKER_NICENESS = "RAY_worker_niceness"
_SETTINGS = (LOCAL_ONLY, AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH, WORKER_NICENESS)


class RayAuthError(RuntimeError):
    """Joining a Ray cluster without authentication, or without a token to authenticate with."""


@dataclass(frozen=True)
class RaySession:
    address: str  # the GCS address
    private: bool  # started (and stopped) by this session
    loopback: bool  # every node of this Ray is this machine, listening on 127.0.0.1
    token_path: Path | None = None  # the private Ray's token file (None when joining)


def is_loopback(address: str) -> bool:
    """Whether a Ray address ("host:port", "ray://host:port", "localhost:6379") names this machine's loopback."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), for gloo and NCCL."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), "lo"))


def write_token(path: Path) -> Path:
    """A fresh random token at `path` (which must not exist), readable by this user only: created 0600, so it is
    never readable by others, not even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    return path


def private_env(token_path: Path) -> dict[str, str | None]:
    """The settings of a private Ray: local-only, token auth with this token (and no inherited token), its workers
    at the caller's priority."""
    return {
        LOCAL_ONLY: "0", AUTH_MODE: "token", AUTH_TOKEN: None, AUTH_TOKEN_PATH: str(token_path), WORKER_NICENESS: "0",
    }  # fmt: skip


def _apply(settings: dict[str, str | None]) -> None:
    for key, value in settings.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "ray" not in sys.modules:
        return  # `import ray` will read the environment
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    ray_constants.ENABLE_RAY_CLUSTER = os.environ.get(LOCAL_ONLY, "1").lower() not in ("0", "false")
    Config.initialize("")  # what ray.init does after setting RAY_AUTH_MODE: re-read the environment
    AuthenticationTokenLoader.instance().reset_cache()


def check_join_auth(address: str) -> None:
    """Joining `address` needs token auth and a token; raise RayAuthError naming the setting otherwise."""
    if os.environ.get(AUTH_MODE, "token").lower() == "disabled":
        raise RayAuthError(
            f"refusing to join the Ray cluster at {address} with RAY_AUTH_MODE=disabled: an unauthenticated Ray is "
            "remote code execution for anyone who reaches it. Enable token auth on the cluster and set "
            "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH here (infra/README.md, 'Ray authentication')."
        )
    if os.environ.get(AUTH_TOKEN):
        return
    path = Path(os.environ.get(AUTH_TOKEN_PATH) or Path.home() / ".ray" / "auth_token").expanduser()
    if not path.is_file() or not path.read_text().strip():
        raise RayAuthError(
            f"no Ray auth token to join the cluster at {address}: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a "
            f"file holding it ({path} is missing or empty); see infra/README.md, 'Ray authentication'."
        )


@contextlib.contextmanager
def ray_session(ray_address: str | None = None, *, num_cpus: int | None = None) -> Iterator[RaySession]:
    """Use the Ray this process already has, join `ray_address` (or RAY_ADDRESS), or start a private one.

    Only a Ray this call started or joined is shut down at the end."""
    import ray

    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        yield RaySession(ctx.gcs_address, private=False, loopback=is_loopback(ctx.gcs_address))
        return
    saved = {key: os.environ.get(key) for key in _SETTINGS}
    # ray.init installs its own SIGTERM handler (sys.exit) and ray.shutdown leaves it there: a later SIGTERM then
    # bypassed the caller's (jf run unwinds SIGTERM like Ctrl-C) and orphaned its Prefect server.
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
    guard = _RaySafeSigterm(sigterm) if callable(sigterm) else None
    init = functools.partial(_init_keeping_sigterm, guard or sigterm) if on_main else ray.init
    token_dir: Path | None = None
    address = ray_address or os.environ.get("RAY_ADDRESS")
    before = set(_children(os.getpid()))
    ray_roots: set[int] | None = None  # the processes a private ray.init started: the GCS, raylet, monitors
    try:
        if address:
            check_join_auth(address)
            # A cluster on this machine's loopback (`jf stack up --ray`) needs this driver on loopback too.
            _apply({AUTH_MODE: "token", LOCAL_ONLY: "0" if is_loopback(address) else None})
            ctx = init(address=address, include_dashboard=False, log_to_driver=False)
            ray_roots = set()  # a cluster's processes are not ours to stop
            session = RaySession(ctx.address_info["gcs_address"], private=False, loopback=is_loopback(address))
        else:
            token_dir = Path(tempfile.mkdtemp(prefix="jf-ray-"))  # 0700
            token = write_token(token_dir / "auth_token")
            _apply(private_env(token))
            # "local": a new Ray, never one that `ray start` left running here (plain ray.init() would join that).
            ctx = init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            ray_roots = set(_children(os.getpid())) - before
            session = RaySession(ctx.address_info["gcs_address"], private=True, loopback=True, token_path=token)
        yield session
    except KeyboardInterrupt as err:
        if guard is not None and guard.raised is not None:
            raise guard.raised from err  # the caller's own signal (Prefect's TerminationSignal), now that it is safe
        raise
    finally:
        # Also when interrupted inside ray.init: what it had started by then is everything new below this process.
        spawned = _descendants(ray_roots if ray_roots is not None else set(_children(os.getpid())) - before)
        if ray.is_initialized() or spawned:
            ray.shutdown()
        _stop_stragglers(spawned)
        _apply(saved)
        if on_main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        if token_dir is not None:
            shutil.rmtree(token_dir, ignore_errors=True)


class _RaySafeSigterm:
    """The caller's SIGTERM handler, made safe to run inside Ray's C code.

    Ray's driver checks for signals inside `ray.get` (`_raylet.check_signals`) and turns a KeyboardInterrupt or a
    SystemExit into its own status; any other exception escapes a C function that cannot pass it on, and comes out
    as `SystemError: ... returned a result with an exception set`. Prefect's SIGTERM bridge raises TerminationSignal
    during a flow run: a `kill` during a round's trajectories became a SystemError, Prefect retried the task, and
    `jf run` finished the whole round (seen in CI). So such an exception is kept aside and a KeyboardInterrupt
    raised in its place; `ray_session` raises the kept one once it is out of Ray's code."""

    def __init__(self, handler):
        self.handler = handler
        self.raised: BaseException | None = None

    def __call__(self, signum, frame):
        try:
            self.handler(signum, frame)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            self.raised = err
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}") from err


def _init_keeping_sigterm(sigterm, **kwargs):
    """`ray.init` on the main thread, with SIGTERM handled in Python by the caller's handler once it returns, and a
    SIGTERM or Ctrl-C that arrives inside `ray.init` never lost.

    The driver's core worker puts abseil's failure-signal handler in front of SIGTERM. That handler passes the
    signal on, but first arms a 3-second alarm that aborts the process (SIGABRT), so any cleanup slower than that
    (closing the flow run, shutting Ray down, stopping the Prefect server) was cut short and orphaned what it had
    not stopped yet. Installing a Python handler after `ray.init` takes abseil off SIGTERM.

    Inside `ray.init` a signal's Python handler (Ray's `sys.exit`, or Ctrl-C's KeyboardInterrupt) may run in the
    middle of a C function, which then fails with `SystemError: ... returned a result with an exception set`: an
    ordinary exception, which Prefect retried, and `jf run` finished the whole round after its SIGTERM. So which
    signals arrived is read from Python's wakeup fd (written by its C-level handler, whatever the Python handler
    did) rather than from the exception, and either signal unwinds as the caller's handler would have."""
    import ray

    with _signals_seen() as seen:
        try:
            ctx = ray.init(**kwargs)
        except BaseException as err:
            arrived = seen()
            if signal.SIGTERM in arrived or isinstance(err, SystemExit):
                _unwind_sigterm(sigterm, err)
            if signal.SIGINT in arrived and not isinstance(err, KeyboardInterrupt):
                raise KeyboardInterrupt("signal SIGINT") from err
            raise
        arrived = seen()
    # Ray's Python handler when the caller has none of its own: reinstalling it is what takes abseil off SIGTERM.
    signal.signal(signal.SIGTERM, sigterm if callable(sigterm) else signal.getsignal(signal.SIGTERM))
    # A handler whose exception a C function swallowed whole: the caller's `finally` shuts this Ray down.
    if signal.SIGTERM in arrived:
        _unwind_sigterm(sigterm, None)
    if signal.SIGINT in arrived:
        raise KeyboardInterrupt("signal SIGINT")
    return ctx


def _unwind_sigterm(sigterm, err: BaseException | None):
    """What the caller's SIGTERM handler does (`jf run`'s raises KeyboardInterrupt), else what Ray's does."""
    signal.alarm(0)  # abseil's abort timer, armed if the SIGTERM went through its handler
    if callable(sigterm):
        signal.signal(signal.SIGTERM, sigterm)
        try:
            sigterm(signal.SIGTERM, None)
        except BaseException as unwound:
            raise unwound from err
    elif sigterm != signal.SIG_IGN:
        raise SystemExit(signal.SIGTERM) from err
    if err is not None:  # a handler that lets the program go on: ray.init's own failure stands
        raise err


@contextlib.contextmanager
def _signals_seen() -> Iterator:
    """Python's wakeup fd pointed at a pipe of ours for the block; yields a function returning the set of signals
    whose C-level handler ran meanwhile. The previous wakeup fd is put back and gets the bytes it missed."""
    read_end, write_end = socket.socketpair()
    for end in (read_end, write_end):
        end.setblocking(False)
    previous = signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    received = bytearray()

    def seen() -> set[int]:
        with contextlib.suppress(BlockingIOError):
            while chunk := read_end.recv(4096):
                received.extend(chunk)
        return set(received)

    try:
        yield seen
    finally:
        seen()
        signal.set_wakeup_fd(previous)
        if previous != -1 and received:
            with contextlib.suppress(OSError):
                os.write(previous, bytes(received))
        read_end.close()
        write_end.close()


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (Linux /proc; empty elsewhere)."""
    out: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
    return out


def _children(pid: int) -> list[int]:
    return [p for p, parent in _parents().items() if parent == pid]


def _descendants(roots: set[int]) -> list[int]:
    parents = _parents()
    found, todo = list(roots), list(roots)
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _stop_stragglers(pids: list[int], grace: float = 5.0) -> None:
    """Kill what a private Ray left running `grace` seconds after `ray.shutdown()`: after a Ctrl-C of `jf run`, its
    dashboard agent stayed up, orphaned (tests/jf_cli/test_run_interrupt.py)."""
    import time

    deadline = time.monotonic() + grace
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# ---- Ray Train on a loopback Ray: rendezvous through a store bound to 127.0.0.1 --------------------------------

_STORE: dict = {}  # rank 0's TCPStore server, alive while the process group is


def _host_store(world_size: int, timeout_s: float) -> int:
    """On rank 0: a TCPStore server on a socket bound to 127.0.0.1 (torch's own binds every interface)."""
    from datetime import timedelta

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    _STORE["socket"] = sock  # the server listens on this descriptor: keep it open
    _STORE["server"] = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    return port


def _join_process_group(backend: str, rank: int, world_size: int, port: int, timeout_s: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    lo = loopback_interface()
    # gloo and NCCL open their own listening sockets on the interface these name.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=lo, NCCL_SOCKET_IFNAME=lo)
    timeout = timedelta(seconds=timeout_s)
    store = _STORE["server"] if rank == 0 else dist.TCPStore("127.0.0.1", port, world_size, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _release_store() -> None:
    _STORE.pop("server", None)
    if (sock := _STORE.pop("socket", None)) is not None:
        sock.close()


def loopback_torch_config(**kwargs):
    """A `TorchConfig` for Ray Train on a loopback Ray (every worker on this machine): same process group as Ray's
    own backend, but the rendezvous store, gloo and NCCL listen on the loopback interface only."""
    import ray
    from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

    class _LoopbackTorchBackend(_TorchBackend):
        def on_start(self, worker_group, backend_config) -> None:
            world = len(worker_group)
            gpus = worker_group.get_resources_per_worker().get("GPU", 0)
            backend = backend_config.backend or ("nccl" if gpus > 0 else "gloo")
            port = worker_group.execute_single(0, _host_store, world, backend_config.timeout_s)
            if not isinstance(worker_group, V1WorkerGroup):  # V1 sets them in on_training_start, as Ray's does
                worker_group.execute(_set_torch_distributed_env_vars)  # RANK, LOCAL_RANK, WORLD_SIZE, ...
            ray.get(
                [
                    worker_group.execute_single_async(
                        rank, _join_process_group, backend, rank, world, port, backend_config.timeout_s
                    )
                    for rank in range(world)
                ]
            )

        def on_shutdown(self, worker_group, backend_config) -> None:
            super().on_shutdown(worker_group, backend_config)
            worker_group.execute_single(0, _release_store)

    class LoopbackTorchConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _LoopbackTorchBackend

    return LoopbackTorchConfig(**kwargs)
