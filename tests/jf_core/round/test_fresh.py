"""Timed work in a new process (jf_core/round/fresh.py): the answer, the callbacks in order in the caller's thread,
the caller's torch thread count, and every way the work can fail reaching the caller."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import pytest

from jf_core.round.fresh import FreshProcessDied, run_fresh


@dataclass(frozen=True)
class Trial:
    name: str
    tps: float


def _work(n: int, *, say, on_trial, scale: float = 1.0):
    for i in range(n):
        say(f"line {i}")
        on_trial(i, n, Trial(f"config {i}", i * scale))
    return {"pid": os.getpid(), "sum": n * scale}


def _threads(*, say):
    import torch

    return torch.get_num_threads()


def _fails(*, say):
    say("started")
    raise ValueError("evaluation.source: no such file")


class _Unpicklable(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.handle = threading.Lock()  # a lock does not pickle


def _fails_unpicklably():
    raise _Unpicklable("the model's weights are missing")


def _dies(*, say):
    say("about to die")
    os._exit(3)


def test_the_work_runs_in_another_process_and_its_callbacks_here_in_order():
    lines, trials, threads = [], [], set()

    def on_trial(i, total, trial):
        trials.append((i, total, trial))
        threads.add(threading.get_ident())

    out = run_fresh(_work, 3, scale=2.0, callbacks={"say": lines.append, "on_trial": on_trial})
    assert out["pid"] != os.getpid() and out["sum"] == 6.0
    assert lines == ["line 0", "line 1", "line 2"]
    assert trials == [(i, 3, Trial(f"config {i}", i * 2.0)) for i in range(3)]
    assert threads == {threading.get_ident()}  # the caller's thread: a Prefect task's logger is used where it runs


def test_a_callback_given_as_none_reaches_the_work_as_none():
    with pytest.raises(TypeError, match="'NoneType' object is not callable"):
        run_fresh(_work, 1, callbacks={"say": print, "on_trial": None})


def test_the_work_runs_on_the_callers_torch_thread_count():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert run_fresh(_threads, callbacks={"say": print}) == 1
    finally:
        torch.set_num_threads(before)


def test_an_error_in_the_work_is_raised_here_as_itself_with_its_traceback():
    lines: list[str] = []
    with pytest.raises(ValueError, match=r"evaluation\.source: no such file") as caught:
        run_fresh(_fails, callbacks={"say": lines.append})
    assert lines == ["started"]  # what it said before failing still arrives
    note = "\n".join(caught.value.__notes__)
    assert "raised in the process running _fails" in note and "in _fails" in note


def test_an_error_that_does_not_pickle_still_reaches_the_caller_by_its_text():
    with pytest.raises(RuntimeError, match="_Unpicklable: the model's weights are missing"):
        run_fresh(_fails_unpicklably)


def test_a_process_that_dies_without_an_answer_says_so_with_its_exit_code():
    lines: list[str] = []
    with pytest.raises(FreshProcessDied, match="running _dies ended with exit code 3 and no result"):
        run_fresh(_dies, callbacks={"say": lines.append})
    assert lines == ["about to die"]
