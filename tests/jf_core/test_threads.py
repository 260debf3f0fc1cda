"""The thread governor, against the real kernel counters: a spinning process beside it takes a thread away, and its
end gives the thread back; a user's count is never changed; the budget follows the affinity mask."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from jf_core.threads import ThreadGovernor, _sample, cpu_budget, others_load, threads_for

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the governor reads /proc/stat")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_for_leaves_the_cores_others_use():
    assert threads_for(0.0, 2) == 2
    assert threads_for(0.05, 2) == 2  # background noise does not cost a thread
    assert threads_for(0.67, 2) == 1  # a busy process squeezed to 2/3 of a core by our 2 threads still counts
    assert threads_for(1.0, 2) == 1
    assert threads_for(3.0, 2) == 1  # never below 1
    assert threads_for(2.5, 8) == 5
    assert threads_for(0.0, 1) == 1


@linux
def test_budget_follows_the_affinity_mask():
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from jf_core.threads import cpu_budget; print(cpu_budget())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert 1 <= cpu_budget() <= (os.cpu_count() or 1)


@linux
def test_others_load_sees_a_spinning_process_and_not_our_own_work():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = _sample()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # our own busy loop must not count as "others"
            pass
        load = others_load(before, _sample())
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.7 <= load <= 1.5, load


@linux
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to give one away")
def test_the_governor_gives_a_thread_to_a_busy_neighbour_and_takes_it_back(restore_threads):
    governor = ThreadGovernor(budget=2, every_s=0.5)
    assert governor.start() == 2  # nothing else running (the test suite runs one test at a time)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        governor._last = _sample()  # measure from here: the spinner's whole interval
        time.sleep(0.8)
        governor.tick(step=10)
        assert torch.get_num_threads() == 1
    finally:
        spinner.kill()
        spinner.wait()
    time.sleep(0.8)
    governor.tick(step=20)
    assert torch.get_num_threads() == 2
    assert governor.changes == [(0, 2), (10, 1), (20, 2)]
    assert governor.record() | {"changes": None} == {
        "policy": "governed",
        "budget": 2,
        "initial": 2,
        "final": 2,
        "min": 1,
        "changes": None,
    }


def test_a_users_count_is_set_once_and_never_changed(restore_threads):
    governor = ThreadGovernor(fixed=1, every_s=0.0)
    assert governor.start() == 1
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        governor.tick(step=5)
    finally:
        spinner.kill()
        spinner.wait()
    assert torch.get_num_threads() == 1
    assert governor.record()["policy"] == "fixed" and governor.changes == [(0, 1)]
