"""CPU thread counts: one count per training run (its model must not follow the load), the free CPUs for decoding.

torch's intra-op pool splits each op over its threads and waits at a barrier for the slowest. When another process
holds a core, one of our threads is descheduled and every op waits for it. Measured on a 2-core machine: a
training step of the embedded model ran 5.3 steps/s alone on torch's 2 threads, 1.95 beside one busy
process, but 3.3 on 1 thread. So the fastest count is the number of CPUs nobody else is using, and that changes
while a round runs (a test suite starts, a benchmark ends).

`ThreadGovernor` measures it from the kernel's counters: the CPU time all processes used since the last look,
minus our own, is the other processes' load; the CPUs left over (of those this process may use: its affinity and
its cgroup quota) set torch's intra-op threads. The training loop asks it every step; it looks every `every_s`
seconds, so a loop pays a clock read per step. Decoding benchmarks take one count at the start instead
(`choose_threads`): their methods take turns, and changing the count between turns would bias the ratios.

**Reproducibility.** A training step's result depends on the thread count: threads split a gradient's sums, and
the order changes their last bits, which thousands of steps amplify (the embedded model trained on 1 and on 2
threads ends with different weights). So training keeps one count unless asked to adapt (`ThreadGovernor.for_training`):
the same command then gives the same model whatever else the machine runs. Decoding does not depend on it (greedy
Jacobi and AR gave identical tokens and forward counts on 1 and 2 threads; tests/jf_core/test_threads.py), so
evaluation takes the free CPUs and only its speed follows the load.

Linux only (/proc/stat); elsewhere the governor keeps torch's count. A count set by the user (`compute.threads`,
`--threads`) is never changed."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("jf.threads")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Headroom before taking one more thread: with n threads beside a busy process the kernel gives that process only
# part of a core, so its measured load under-states what it would take back; 0.4 keeps a shared machine on the
# smaller count instead of flapping between the two.
_MARGIN = 0.4


CPUS_ENV = "JF_CPUS"  # an operator's cap on the CPUs jf uses (a shared machine); every process jf starts inherits it


OMP_ENV = "OMP_NUM_THREADS"  # the count an OpenMP pool starts with: torch's intra-op pool reads it at import


def cap_default_threads(env: MutableMapping[str, str] = os.environ) -> None:
    """JF_CPUS, when set in `env`, as the count every OpenMP pool started under it defaults to. Commands that set no
    count of their own (`jf decode`, `jf serve`) kept torch's default of one thread a core under JF_CPUS=1 (a thread
    sampler over the test suite saw `jf decode` compute on two): the cap is the operator's for every process jf
    starts, and a pool's threads wait at each op's barrier for one the load has descheduled (docs/development.md,
    "Threads that do not read JF_CPUS"). A count already in OMP_NUM_THREADS is the user's, and kept; a process that
    sets its own count (the thread governor) still does."""
    if env.get(CPUS_ENV) and OMP_ENV not in env:
        env[OMP_ENV] = str(cpu_budget(env))


def cpu_budget(env: Mapping[str, str] = os.environ) -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (containers, k8s limits) and by
    JF_CPUS when set in `env` (a machine shared with other work, where neither of the others says so)."""
    cap = env.get(CPUS_ENV)
    if cap is not None and not (cap.isdigit() and int(cap) >= 1):
        raise ValueError(f"{CPUS_ENV}={cap!r}: expected a whole number of CPUs >= 1")
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, min(cpus, int(cap)) if cap is not None else cpus)


@dataclass(frozen=True)
class _Sample:
    busy: float  # CPU-seconds every process has used since boot (all CPUs)
    own: float  # CPU-seconds this process has used (all its threads)
    wall: float


def _sample() -> _Sample | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait was spent running something
    ticks = [int(x) for x in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    t = os.times()
    return _Sample(busy / _CLOCK_TICKS, t.user + t.system, time.monotonic())


def others_load(before: _Sample, after: _Sample) -> float:
    """CPUs other processes kept busy between two samples (0 when the interval is too short to tell)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def threads_for(load: float, budget: int) -> int:
    """The count for `budget` CPUs of which others use `load`: whole free CPUs, at least 1."""
    return max(1, min(budget, math.floor(budget - load + _MARGIN)))


def choose_threads(probe_s: float = 0.3, budget: int | None = None) -> int:
    """One count for work that must not change it midway (speed measurements): the CPUs free over `probe_s`."""
    budget = budget or cpu_budget()
    before = _sample()
    if before is None:
        return budget
    time.sleep(probe_s)
    after = _sample()
    return threads_for(others_load(before, after), budget) if after else budget


class ThreadRecord(BaseModel):
    """The thread counts a training run used (`ThreadGovernor.record()`): its params, and where its count changed.
    Empty (every field None) for a run no governor watched (on a GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["fixed", "governed"] | None = None
    budget: int | None = None
    initial: int | None = None
    final: int | None = None
    min: int | None = None
    changes: list[tuple[int, int]] = []  # (step, threads) each time the count changed
    contended_at: int | None = None  # the first step at which others held CPUs a fixed count needed


@dataclass
class ThreadGovernor:
    """Sets torch's intra-op threads to the CPUs free of other processes, re-measured every `every_s` seconds.

    `fixed`: a count the user chose; set once, never changed. `record()` is what the run's params keep."""

    fixed: int | None = None
    budget: int = field(default_factory=cpu_budget)
    every_s: float = 2.0
    changes: list[tuple[int, int]] = field(default_factory=list)  # (step, threads) each time the count changed
    contended_at: int | None = None  # the first step at which others held CPUs a fixed count needed
    _last: _Sample | None = None

    def start(self, step: int = 0) -> int:
        import torch

        if self.fixed is not None:
            self._set(step, self.fixed)
            self._last = _sample()  # a fixed count is still watched: its user is told when others slow it down
            return self.fixed
        self.budget = max(1, self.budget)
        self._set(step, choose_threads(budget=self.budget))
        self._last = _sample()
        return torch.get_num_threads()

    def tick(self, step: int) -> None:
        """Called once per training step; re-measures when `every_s` has passed."""
        if self._last is None or time.monotonic() - self._last.wall < self.every_s:
            return
        now = _sample()
        if now is None:
            return
        load = others_load(self._last, now)
        count = threads_for(load, self.budget)
        self._last = now
        if self.fixed is not None:
            if count < self.fixed and self.contended_at is None:
                self.contended_at = step
                self._warn_contended(load)
        elif count != self.changes[-1][1]:
            self._set(step, count)

    def _warn_contended(self, load: float) -> None:
        # A log record, not a Python warning: a condition of the machine, not of the caller's code, read as one line
        # (no file, line and source) in the terminal, and a flow's task forwards it into its run's log
        # (tasks/run_logs.py), where a worker's stderr would lose it.
        log.warning(
            "other processes are using %.1f of the %d CPUs this training may use: it keeps its %d threads, so that "
            "its model does not depend on the load, and every step now waits for the thread they preempt (several "
            "times slower). Beside other work, compute.threads set to the CPUs left free is faster and still gives "
            "the same model on every run with that setting; compute.adaptive_threads=true follows the free CPUs as "
            "they change, and the model then follows the load.",
            load,
            self.budget,
            self.fixed,
        )

    def _set(self, step: int, count: int) -> None:
        import torch

        torch.set_num_threads(count)
        self.changes.append((step, count))

    @classmethod
    def for_training(cls, threads: int | None = None, adaptive: bool = False) -> ThreadGovernor:
        """Training's threads: `threads`, else every CPU this process may use, kept for the whole run (the model
        does not depend on the load); `adaptive` follows the free CPUs instead (faster beside other work)."""
        if adaptive and threads is None:
            return cls()
        return cls(fixed=threads or cpu_budget())

    def record(self) -> ThreadRecord:
        counts = [n for _, n in self.changes]
        return ThreadRecord(
            policy="fixed" if self.fixed is not None else "governed",
            budget=self.budget,
            initial=counts[0] if counts else None,
            final=counts[-1] if counts else None,
            min=min(counts) if counts else None,
            changes=list(self.changes),
            contended_at=self.contended_at,
        )
