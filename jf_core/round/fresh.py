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
kernel's OOM killer, a crash in native code) raises `FreshProcessDied` with its exit code."""

from __future__ import annotations

import multiprocessing
import sys
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from jf_core.config import Profile

T = TypeVar("T")


class FreshProcessDied(RuntimeError):
    """The process running the work ended without returning or raising (killed, or crashed in native code)."""


def _forward(conn, name: str, *args: Any) -> None:
    conn.send(("call", name, args))


def _child(conn, fn: Callable, args: tuple, kwargs: dict, callbacks: list[str], threads: int | None) -> None:
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


def run_fresh(fn: Callable[..., T], *args: Any, callbacks: Mapping[str, Callable | None] | None = None, **kwargs) -> T:
    """`fn(*args, **kwargs, **callbacks)` in a new process; its result, or its error raised here. `fn`, the
    arguments and the result must pickle (`fn` a module-level function). A callback given as None is passed as
    None; the others are called here with what the child called them with."""
    callbacks = dict(callbacks or {})
    live = {name: cb for name, cb in callbacks.items() if cb is not None}
    kwargs |= {name: None for name, cb in callbacks.items() if cb is None}
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    what = getattr(fn, "__qualname__", repr(fn))
    child = ctx.Process(target=_child, args=(writer, fn, args, kwargs, list(live), threads), name=f"jf {what}")
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
