"""Execution sandbox for generated code: one fresh process per program, and nothing of it left afterwards.

Layers, each covering what the one before cannot:
- a fresh temporary working directory (removed afterwards) and an environment with nothing inherited: no secrets,
  no PYTHONPATH, HOME and TMPDIR inside that directory;
- resource limits (setrlimit): CPU seconds, address space, file size (an output flood or a huge file dies with
  SIGXFSZ; stdout and stderr are files under the same cap), open files, no core dumps, and a process count;
- when the evaluator runs as root, the program runs as its own unprivileged uid (a fresh one per run, from
  `uid_base`), which makes the process limit count (root ignores RLIMIT_NPROC), forbids writing anything the
  program does not own, and lets the final sweep find every process it made, even one that left the process group
  with setsid();
- an audit hook installed before the program runs refuses opening files for writing, deleting, renaming or
  changing files outside the working directory, and loading ctypes (which would bypass the hook);
- a wall-clock timeout, after which (and in any case at the end) the whole process group is killed, then every
  process of the sandbox uid.

The program passes only if it exits 0 *and* its last statement ran: the harness prints a random marker after the
program's code, so `exit(0)` before the tests, or killing the test runner, cannot fake a pass.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_GUARD = r"""
import os, sys
_root = os.path.realpath(os.getcwd())
_harness = os.path.dirname(_root)
def _inside(path):
    try:
        p = os.fspath(path)
    except TypeError:
        return True  # file descriptors: opened earlier, already checked
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    p = os.path.realpath(os.path.join(_root, p))
    return p == _root or p.startswith(_root + os.sep) or p in ("/dev/null",)
_WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                 "os.symlink", "os.link", "shutil.rmtree", "shutil.move", "os.utime"}
def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {path}")
        if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path):
            real = os.path.realpath(os.fsdecode(os.fspath(path)))
            if real.startswith(_harness + os.sep):
                raise PermissionError("sandbox: the harness files are not readable")
    elif event in _WRITE_EVENTS:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {a}")
    elif event == "import" and args[0] in ("ctypes", "_ctypes"):
        raise PermissionError("sandbox: ctypes is not allowed")
    elif event == "ctypes.dlopen":
        raise PermissionError("sandbox: ctypes is not allowed")
sys.addaudithook(_hook)
del _hook
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10
    memory_mb: int = 1024  # address space
    max_processes: int = 32  # per sandbox uid (enforced when the evaluator runs as root)
    max_file_mb: int = 16  # any file, stdout and stderr included
    max_open_files: int = 64
    uid_base: int = 61000  # root only: sandbox uids are uid_base + (pid-derived offset)
    python: str | None = None  # None: this interpreter, or a system python3 when the sandbox uid cannot reach it


@dataclass
class ExecResult:
    passed: bool
    status: str  # passed | failed | timeout | killed
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def _limits(limits: SandboxLimits, uid: int | None):
    def apply() -> None:
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb * mb, limits.max_file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
            os.setuid(uid)

    return apply


def _sandbox_uid(limits: SandboxLimits) -> int | None:
    if os.geteuid() != 0:
        return None
    return limits.uid_base + (os.getpid() * 7919 + time.monotonic_ns()) % 2000


def _reachable_by_others(path: str) -> bool:
    """Whether an unprivileged uid can execute `path` (every directory on the way searchable, the file executable)."""
    real = Path(os.path.realpath(path))
    try:
        return all(p.stat().st_mode & 0o001 for p in [*real.parents, real])
    except OSError:
        return False


def _interpreter(limits: SandboxLimits, uid: int | None) -> str:
    if limits.python:
        return limits.python
    if uid is None:
        return sys.executable
    # The programs need only the standard library: any CPython of a reachable path will do.
    for candidate in (
        sys.executable,
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ):
        if candidate and _reachable_by_others(candidate):
            return os.path.realpath(candidate)
    raise RuntimeError("no Python interpreter the sandbox uid can execute; set SandboxLimits.python")


def _pids_of_uid(uid: int) -> list[int]:
    """Live processes of `uid` (zombies are dead already: their parent, or init, reaps them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if entry.stat().st_uid == uid and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
    return pids


def _kill_all(pgid: int, uid: int | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if uid is None:
        return
    for _ in range(50):  # a fork bomb may still be forking while we sweep
        pids = _pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def run_program(code: str, limits: SandboxLimits = SandboxLimits()) -> ExecResult:
    marker = f"__jf_sandbox_done_{secrets.token_hex(8)}__"
    uid = _sandbox_uid(limits)
    work = Path(tempfile.mkdtemp(prefix="jf-sandbox-"))
    try:
        run_dir = work / "run"
        run_dir.mkdir()
        (run_dir / "program.py").write_text(code)
        (work / "guard.py").write_text(_GUARD)
        out_path, err_path = work / "stdout", work / "stderr"
        # The marker lives in a harness file the guard forbids reading, not on the command line (/proc/*/cmdline).
        # A program that introspects the interpreter's frames could still find it: the marker defends against
        # early exits, the kernel-enforced layers against harm.
        (work / "runner.py").write_text(
            f"exec(open({str(work / 'guard.py')!r}).read())\n"
            f"exec(compile(open('program.py').read(), 'program.py', 'exec'), {{'__name__': '__main__'}})\n"
            f"print({marker!r}, flush=True)\n"
        )
        env = {"PATH": "/usr/bin:/bin", "HOME": str(run_dir), "TMPDIR": str(run_dir), "LANG": "C.UTF-8"}
        if uid is not None:
            for path in (run_dir, run_dir / "program.py"):
                os.chown(path, uid, uid)
            os.chmod(work, 0o755)
            for name in ("guard.py", "runner.py"):
                os.chmod(work / name, 0o644)
        started = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [_interpreter(limits, uid), "-I", "-B", str(work / "runner.py")],
                cwd=run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_limits(limits, uid),
            )
            status = None
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                _kill_all(proc.pid, uid)
                proc.wait()
        seconds = time.perf_counter() - started
        stdout = out_path.read_bytes()[-65536:].decode(errors="replace")
        stderr = err_path.read_bytes()[-65536:].decode(errors="replace")
        passed = status is None and proc.returncode == 0 and stdout.rstrip().endswith(marker)
        if status is None:
            status = (
                "passed" if passed else ("killed" if proc.returncode is not None and proc.returncode < 0 else "failed")
            )
        return ExecResult(passed, status, proc.returncode, stdout.replace(marker, "").rstrip(), stderr, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
