"""Timed work in a new Python process: the speed a consumer's process gets, not what this process's history leaves.

A round's tunes and evaluations time decoders against our AR, and their ratios decide the decode config a model
ships with and whether the gate promotes it. Measured on SmolLM2-135M on a 2-core CPU (2026-12-03,
docs/experiments/user-round-gsm8k.md, "Why the round's timings were slow"): in a process that had just trained the
draft adapter for 60-100 steps, our untrained decoder's cycle cost 1.30-1.48 AR steps, while a new process measuring
at the same moments read 1.07-1.20 (and the same process before training 1.04-1.15); returning the freed memory
(`gc.collect`, `malloc_trim`: 2.7 GB) did not mend it. One-token AR steps were hardly touched, so every drafter's
ratio came out low, the trained adapter's most. `run_fresh` runs such work in a process started for it (`spawn`:
nothing of this process's heap, threads or libraries' state is inherited), with this process's torch thread count.

Callbacks (progress lines, per-trial figures) cannot cross a process boundary, so the child gets stand-ins that send
their arguments back over a pipe, where `run_fresh` calls the real ones in the caller's thread, in order. An error
in the child is raised here as itself (its traceback attached as a note); a child that dies without an answer (the
kernel's OOM killer, a crash in native code) raises `FreshProcessDied` with its exit code.

How the process starts: a new interpreter costs 3-4 s of imports (torch, transformers, ours) on this project's
2-core CPU, paid by each of a round's four timed stages and by every round the tests run. So where the platform has
it, the work runs in a child of multiprocessing's fork server, a process started once for the caller that has
imported those modules and done nothing else (no tensors, no thread pools, no training): each child is a fork of
that clean state, which costs a fraction of a second. The child takes the caller's environment, working directory,
stdout and stderr as they are at the call (a fork server keeps the ones it started with); and where the caller's
environment differs from the server's in what the preloaded libraries read when imported (`IMPORT_ENV`), the child
declines, the server is stopped and a new one started under the caller's environment (the price of one new
interpreter, then forks again: a caller whose setting changed once, or a server first started inside a block that
set one for a while, would otherwise spawn every stage after it). Where no fork server exists, or it cannot be
restarted, the work runs in a new interpreter (`spawn`)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from multiprocessing import reduction
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from jf_core.config import Profile

T = TypeVar("T")

# What the fork server imports once, before any child: the modules every timed stage's work loads (a module not
# listed is imported by the child that needs it). "__main__", the caller's script, only where Python hands the
# server its path (3.11 does not: each child imports it again, 8 ms for `jf`, Prefect's engine for a deployment run).
PRELOAD = (
    "__main__",
    "jf_core.round.fresh",  # before the libraries: its import keeps the environment they are imported under
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",  # SmolLM2, Llama
    "transformers.models.qwen2.modeling_qwen2",  # the embedded model, Qwen2.5-Coder
    "jf_core.models",
    "jf_core.evaluation.evaluate",
    "jf_core.evaluation.tune",
    "jf_core.round.stages",
)
# Environment variables those libraries read when imported (thread pools, devices, caches, hub settings): a child of
# a server that imported them under other values would not run as a new process would, so it declines.
IMPORT_ENV = (
    *("OMP_", "MKL_", "KMP_"),  # thread pools
    *("TORCH", "PYTORCH", "CUDA", "NVIDIA"),  # torch's settings and devices
    *("HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "XDG_"),  # the hub's settings and caches
)


def _import_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(IMPORT_ENV)}


# In a fork server: what its libraries were imported under (this module is preloaded first). In a spawned child:
# the caller's environment at the call, as its own.
_IMPORTED_UNDER = _import_env(os.environ)


def _imported_otherwise(caller: Mapping[str, str]) -> bool:
    """Whether the caller's environment has a value the server's libraries were not imported under: each of its
    variables must be as the server started, or as the server's own imports set it (torch sets
    TORCHINDUCTOR_CACHE_DIR when a model's module is imported, in the caller as in the server)."""
    call, now = _import_env(caller), _import_env(os.environ)  # now: the server's, after its imports (a fork's own)
    keys = call.keys() | now.keys() | _IMPORTED_UNDER.keys()
    return any(call.get(k) not in (_IMPORTED_UNDER.get(k), now.get(k)) for k in keys)


class FreshProcessDied(RuntimeError):
    """The process running the work ended without returning or raising (killed, or crashed in native code)."""


def _forward(conn, name: str, *args: Any) -> None:
    conn.send(("call", name, args))


class _CallersOutput:
    """The caller's stdout and stderr as they are at the call (pytest's capture, a redirect), sent to the child as
    file descriptors: a fork server's children would otherwise write where the server's first caller's went."""

    def __reduce__(self):
        open_now = [fd for fd in (1, 2) if _is_open(fd)]
        return _received_output, (open_now, *(reduction.DupFd(fd) for fd in open_now))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _received_output(targets: list[int], *dup_fds) -> list[tuple[int, int]]:
    return [(target, fd.detach()) for target, fd in zip(targets, dup_fds, strict=True)]


def _adopt(setting: tuple[dict[str, str], list[tuple[int, int]] | None]) -> None:
    environ, output = setting
    os.environ.clear()
    os.environ.update(environ)
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in output or ():
        os.dup2(fd, target)
        os.close(fd)


def _child(conn, fn: Callable, args: tuple, kwargs: dict, callbacks: list[str], threads: int | None, setting) -> None:
    if _imported_otherwise(setting[0]):
        conn.send(("declined",))
        conn.close()
        return
    _adopt(setting)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        result = fn(*args, **kwargs, **{name: partial(_forward, conn, name) for name in callbacks})
    except BaseException as err:  # every failure goes back to the caller, which raises it
        text = traceback.format_exc()
        try:
            conn.send(("error", err, text))
        except Exception:  # an exception that does not pickle still reaches the caller, by its text
            conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}"), text))
    else:
        conn.send(("result", result))
    finally:
        conn.close()


# One child started at a time in this process: a fork server is stopped (below) only between two starts, never while
# another thread's start is connecting to it.
_STARTING = threading.Lock()


def _restart_server() -> bool:
    """Stop this process's fork server, so that the next start begins a new one under the environment as it is now;
    False where it cannot be (`ForkServer._stop`, the private method CPython's own tests stop it with, 3.8 on).
    Children already forked run on: each answers over its own pipe."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is None:
        return False
    with _STARTING:
        stop()
    return True


def _start_method() -> str:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))  # read when it first starts
    return "forkserver"


def run_fresh(fn: Callable[..., T], *args: Any, callbacks: Mapping[str, Callable | None] | None = None, **kwargs) -> T:
    """`fn(*args, **kwargs, **callbacks)` in a new process; its result, or its error raised here. `fn`, the
    arguments and the result must pickle (`fn` a module-level function). A callback given as None is passed as
    None; the others are called here with what the child called them with."""
    return _run(_start_method(), fn, args, kwargs, dict(callbacks or {}))


def _run(
    method: str,
    fn: Callable[..., T],
    args: tuple,
    kwargs: dict,
    callbacks: dict[str, Callable | None],
    retried: bool = False,
) -> T:
    live = {name: cb for name, cb in callbacks.items() if cb is not None}
    work_kwargs = kwargs | {name: None for name, cb in callbacks.items() if cb is None}
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    ctx = multiprocessing.get_context(method)
    reader, writer = ctx.Pipe(duplex=False)
    what = getattr(fn, "__qualname__", repr(fn))
    setting = (dict(os.environ), _CallersOutput() if method == "forkserver" else None)  # spawn inherits both
    work = (writer, fn, args, work_kwargs, list(live), threads, setting)
    child = ctx.Process(target=_child, args=work, name=f"jf {what}")
    with _STARTING:
        child.start()
    writer.close()  # the child holds the only writer: its end (or death) is this reader's EOF
    answered = False
    try:
        while True:
            try:
                kind, *payload = reader.recv()
            except EOFError:
                child.join()
                raise FreshProcessDied(
                    f"the process running {what} ended with exit code {child.exitcode} and no result"
                ) from None
            if kind == "call":
                name, call_args = payload
                live[name](*call_args)
            elif kind == "declined":  # a server imported under other settings: a new one under the caller's
                answered = True
                again = "forkserver" if not retried and _restart_server() else "spawn"
                return _run(again, fn, args, kwargs, callbacks, retried=True)
            elif kind == "result":
                answered = True
                return payload[0]
            else:
                answered = True
                err, text = payload
                err.add_note(f"raised in the process running {what}:\n{text}")
                raise err
    finally:
        reader.close()
        if not answered and child.is_alive():  # the caller was interrupted (Ctrl-C, a cancelled task): the work
            child.kill()  # must not outlive it
        child.join()


def timed_work(profile: Profile, fn: Callable[..., T], *args: Any, **callbacks: Callable | None) -> T:
    """`fn(*args, **callbacks)` for a stage that times decoding (tunes, evaluations: jf_core/round/stages.py): in a
    new process when `evaluation.fresh_process`, else here. `callbacks` are its progress hooks, called here."""
    if not profile.evaluation.fresh_process:
        return fn(*args, **callbacks)
    return run_fresh(fn, *args, callbacks=callbacks)
