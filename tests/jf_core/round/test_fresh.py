"""Timed work in a new process (jf_core/round/fresh.py): the answer, the callbacks in order in the caller's thread,
the caller's torch thread count, and every way the work can fail reaching the caller."""

from __future__ import annotations

import multiprocessing
import os
import threading
from dataclasses import dataclass

import psutil
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


def _where(*, say):
    import sys

    say(f"the child {os.getpid()} says hello")
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "marker": os.environ.get("JF_FRESH_MARKER"),
        "imported": "transformers" in sys.modules and "jf_core.evaluation.evaluate" in sys.modules,
    }


def test_each_call_is_a_new_child_of_one_clean_server_with_the_callers_environment_directory_and_output(
    tmp_path, monkeypatch, capfd
):
    """The work's process is a fork of a server that has only imported the timed stages' modules (where the platform
    has a fork server): each call a new one, started with what the caller has at the call, not what it had when the
    server started."""
    first = run_fresh(_where, callbacks={"say": print})
    monkeypatch.setenv("JF_FRESH_MARKER", "set after the server started")
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    second = run_fresh(_where, callbacks={"say": lines.append})
    assert first["pid"] != second["pid"] and os.getpid() not in (first["pid"], second["pid"])
    assert first["marker"] is None and second["marker"] == "set after the server started"
    assert second["cwd"] == str(tmp_path)
    assert lines == [f"the child {second['pid']} says hello"]
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert first["ppid"] == second["ppid"] != os.getpid()  # one server, not this process
        assert second["imported"]  # forked from the server's imports, not importing them again


def _prints():
    import sys

    print("to the caller's stdout")
    print("to the caller's stderr", file=sys.stderr)
    return True


def test_what_the_work_prints_goes_where_the_callers_output_goes_now(capfd):
    run_fresh(_where, callbacks={"say": print})  # the server may have started under another test's capture
    capfd.readouterr()
    assert run_fresh(_prints)
    out, err = capfd.readouterr()
    assert "to the caller's stdout" in out and "to the caller's stderr" in err


def test_a_library_setting_the_server_was_not_imported_under_starts_a_new_server_under_it(monkeypatch):
    """torch and transformers read some environment variables when imported (`IMPORT_ENV`): a fork of a server
    imported under other values would not be the process the caller asked for, so that server is stopped and the
    work forked from a new one imported under the caller's values, which the calls after it fork from too (before,
    every later call started a new interpreter)."""
    before = run_fresh(_where, callbacks={"say": print})  # the server is up
    monkeypatch.setenv("TORCH_JF_FRESH_TEST", "1")
    changed = run_fresh(_where, callbacks={"say": print})
    after = run_fresh(_where, callbacks={"say": print})
    if "forkserver" not in multiprocessing.get_all_start_methods():
        assert changed["ppid"] == after["ppid"] == os.getpid()  # spawned by this process
        return
    assert changed["ppid"] not in (os.getpid(), before["ppid"]) and changed["imported"]
    assert after["ppid"] == changed["ppid"]  # forked from the new server again
    assert not psutil.pid_exists(before["ppid"])  # the old server stopped


def test_a_variable_the_libraries_set_themselves_on_import_does_not_count_as_another_setting(monkeypatch):
    """torch sets TORCHINDUCTOR_CACHE_DIR when a model's module is imported: a caller that loaded a model after its
    fork server started has it, as the server's own imports do, and that is no reason to spawn. Any other value,
    or a variable the server never saw, is."""
    from jf_core.round import fresh

    monkeypatch.setattr(fresh, "_IMPORTED_UNDER", {})  # the server started before anyone imported a model
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_default")  # its imports set it
    for key in [k for k in os.environ if k.startswith(fresh.IMPORT_ENV) and k != "TORCHINDUCTOR_CACHE_DIR"]:
        monkeypatch.delenv(key)
    assert not fresh._imported_otherwise({})  # the caller has imported no model yet
    assert not fresh._imported_otherwise({"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_default"})
    assert fresh._imported_otherwise({"TORCHINDUCTOR_CACHE_DIR": "/elsewhere"})
    assert fresh._imported_otherwise({"TORCH_JF_FRESH_TEST": "1"})
