"""The thread governor, against the real kernel counters: a spinning process beside it takes a thread away, and its
end gives the thread back; a user's count is never changed; the budget follows the affinity mask."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from jf_core.decoding.common import StopTokens
from jf_core.threads import (
    CPUS_ENV,
    ThreadGovernor,
    _sample,
    cap_default_threads,
    cpu_budget,
    others_load,
    threads_for,
)

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the governor reads /proc/stat")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# The machine's CPUs, whatever JF_CPUS caps jf to (each test worker takes one: tests/conftest.py).
MACHINE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture
def whole_machine(monkeypatch):
    """For an `alone` test, which has the CPUs to itself: no JF_CPUS cap."""
    monkeypatch.delenv(CPUS_ENV, raising=False)


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
@pytest.mark.alone
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
@pytest.mark.alone
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to give one away")
def test_the_governor_gives_a_thread_to_a_busy_neighbour_and_takes_it_back(restore_threads):
    governor = ThreadGovernor(budget=2, every_s=0.5)
    assert governor.start() == 2  # nothing else running (`alone`: the other test worker waits)
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
    assert governor.record().model_dump() | {"changes": None} == {
        "policy": "governed",
        "budget": 2,
        "initial": 2,
        "final": 2,
        "min": 1,
        "changes": None,
        "contended_at": None,
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
    assert governor.record().policy == "fixed" and governor.changes == [(0, 1)]


def _train_embedded_recipe(governor: ThreadGovernor, steps: int = 30) -> dict[str, torch.Tensor]:
    """A few steps of the embedded model's bootstrap recipe (same model, data and optimizer), its final weights."""
    from dataclasses import replace

    from jf_core.toy.bootstrap import BootstrapConfig
    from jf_core.toy.data import ar_batches
    from jf_core.toy.model import build_model
    from jf_core.toy.task import make_split
    from jf_core.toy.tokenizer import build_tokenizer
    from jf_core.training.trainer import causal_lm_loss, train

    cfg = BootstrapConfig()
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer()
    model = build_model(cfg.model, len(tok), tok.pad_token_id, tok.eos_token_id, cfg.seed)
    batches = ar_batches(tok, make_split("train", 1000, cfg.task), cfg.batch_size, cfg.seed)
    loop = replace(cfg.train, steps=steps, warmup_steps=5, log_every=1000)
    train(model, batches, causal_lm_loss, loop, progress=False, threads=governor)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@linux
@pytest.mark.alone
@pytest.mark.skipif(MACHINE_CPUS < 2, reason="needs 2 CPUs for a count the load could change")
@pytest.mark.filterwarnings("ignore:other processes are using")  # the slowdown it is told about
def test_training_gives_the_same_weights_alone_and_beside_a_busy_process(restore_threads, whole_machine):
    """The same command gives the same model whatever else runs: training keeps one thread count. (The adaptive
    governor beside a spinner takes 1 thread, and 1 and 2 threads sum gradients in different orders.)"""
    alone = _train_embedded_recipe(ThreadGovernor.for_training())
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        governor = ThreadGovernor.for_training()
        busy = _train_embedded_recipe(governor)
    finally:
        spinner.kill()
        spinner.wait()
    assert governor.record().policy == "fixed" and governor.record().min == cpu_budget()
    assert alone.keys() == busy.keys()
    assert all(torch.equal(alone[k], busy[k]) for k in alone), "training followed the machine's load"


def test_for_training_pins_unless_asked_to_adapt():
    assert ThreadGovernor.for_training().fixed == cpu_budget()
    assert ThreadGovernor.for_training(3).fixed == 3
    assert ThreadGovernor.for_training(3, adaptive=True).fixed == 3  # a user's count wins
    assert ThreadGovernor.for_training(adaptive=True).fixed is None


def test_decoding_gives_the_same_tokens_and_forwards_on_any_thread_count(embedded, restore_threads):
    """Why evaluation may take the free CPUs: its figures (accuracy, TPF, identity with AR) do not move with them."""
    from jf_core.decoding import decode
    from jf_core.decoding.ar import ar_decode
    from jf_core.decoding.jacobi import JacobiConfig
    from jf_core.toy.task import make_split

    model, tok = embedded
    prompts = [tok(e.prompt)["input_ids"] for e in make_split("test", 24)]
    ids = StopTokens(tok.eos_token_id, tok.pad_token_id)
    runs = []
    for count in (1, 2):
        torch.set_num_threads(count)
        jacobi = decode(model, prompts, JacobiConfig(block_size=16, max_new_tokens=96), stop=ids)
        ar = ar_decode(model, prompts, max_new_tokens=96, stop=ids)
        runs.append((jacobi.sequences, jacobi.stats.sequences, ar.sequences))  # not its timings
    assert runs[0] == runs[1]


@linux
@pytest.mark.alone
@pytest.mark.skipif(MACHINE_CPUS < 2, reason="needs 2 CPUs for others to take one")
def test_a_fixed_count_beside_a_busy_process_is_kept_and_its_user_told(restore_threads, whole_machine, caplog):
    governor = ThreadGovernor(fixed=2, budget=2, every_s=0.5)
    governor.start()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        governor._last = _sample()  # measure from here: the spinner's whole interval
        time.sleep(0.8)
        with caplog.at_level(logging.WARNING, logger="jf.threads"):
            governor.tick(step=7)
    finally:
        spinner.kill()
        spinner.wait()
    assert torch.get_num_threads() == 2 and governor.changes == [(0, 2)]
    assert governor.record().contended_at == 7
    # a log record (tasks forward jf.* records into their run's log), said once, naming the setting that helps
    told = [r for r in caplog.records if r.name == "jf.threads"]
    assert len(told) == 1 and told[0].levelno == logging.WARNING, caplog.records
    assert "compute.threads set to the CPUs left free" in told[0].getMessage()


def test_jf_cpus_caps_the_budget_and_a_bad_value_is_named(monkeypatch):
    """An operator's cap on a shared machine: it lowers the budget (and so a training's thread count), never raises
    it above what the affinity mask allows, and a value that is not a count fails naming the variable."""
    machine = len(os.sched_getaffinity(0))
    monkeypatch.setenv("JF_CPUS", "1")
    assert cpu_budget() == 1 and ThreadGovernor.for_training().fixed == 1
    monkeypatch.setenv("JF_CPUS", str(machine + 8))
    assert cpu_budget() <= machine
    for bad in ("0", "two", "-1", ""):
        monkeypatch.setenv("JF_CPUS", bad)
        with pytest.raises(ValueError, match="JF_CPUS="):
            cpu_budget()


@linux
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs for torch's default to exceed the cap")
def test_jf_cpus_is_the_thread_count_a_jf_command_starts_torch_on():
    """`jf decode` and `jf serve` set no count of their own: under JF_CPUS their torch starts on the operator's cap,
    not on one thread a core, and so do the processes they start; a user's OMP_NUM_THREADS is kept."""
    for before, after in (({CPUS_ENV: "1"}, "1"), ({CPUS_ENV: "1", "OMP_NUM_THREADS": "3"}, "3"), ({}, None)):
        env = dict(before)
        cap_default_threads(env)
        assert env.get("OMP_NUM_THREADS") == after, before
    code = "from jf_cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\nimport torch\n"
    code += "print(torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {CPUS_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == "1", out.stderr[-2000:]
