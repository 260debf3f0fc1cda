"""The execution sandbox contains hostile programs: each kind below is stopped or refused, the evaluation goes on,
and nothing of it is left on the machine (no process of its uid, no file outside its directory, no temp dir)."""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

import pytest

from jf_core.evaluation.sandbox import SandboxLimits, _pids_of_uid, run_program

pytestmark = pytest.mark.timeout(300)
FAST = SandboxLimits(timeout_s=3.0, cpu_s=3, memory_mb=512, max_file_mb=1)


def run(code: str, limits: SandboxLimits = FAST):
    return run_program(textwrap.dedent(code), limits)


def test_a_correct_program_passes_and_a_failing_one_fails():
    assert run("assert sum([1, 2]) == 3\nprint('ok')").passed
    bad = run("assert 1 == 2")
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.stderr


def test_exit_before_the_tests_is_not_a_pass():
    assert not run("import sys\nsys.exit(0)\nassert False").passed
    assert not run("import os\nos._exit(0)").passed


HOSTILE = {
    "infinite loop": "while True:\n    pass",
    "sleeps past the wall clock": "import time\ntime.sleep(60)",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "orphaned child": "import os, time\nif os.fork() == 0:\n    time.sleep(120)\nos._exit(0)",
    "setsid daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\ntime.sleep(60)",
    "memory hog": "x = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))",
    "output flood": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "huge file": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * 1048576)",
    "crash": "import os\nos.abort()",
    "deep recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    "ctypes": "import ctypes\nctypes.CDLL(None).system(b'true')",
    "kill the evaluator": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_programs_are_contained(kind):
    before = set(os.listdir(tempfile.gettempdir()))
    result = run(HOSTILE[kind])
    assert not result.passed
    assert result.seconds < 30
    if os.geteuid() == 0:  # the sandbox uid's processes are all gone
        assert not [p for p in _pids_of_uid_range()], kind
    leftovers = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("jf-sandbox-")}
    assert not leftovers


def _pids_of_uid_range():
    limits = SandboxLimits()
    return [pid for uid in range(limits.uid_base, limits.uid_base + 2000) for pid in _pids_of_uid(uid)]


def test_files_outside_the_working_directory_are_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    target = Path(tempfile.gettempdir()) / "jf-sandbox-escape.txt"
    code = f"""
        import os, shutil
        for attempt in (lambda: open({str(victim)!r}, 'w').write('x'),
                        lambda: os.remove({str(victim)!r}),
                        lambda: open({str(target)!r}, 'w').write('x'),
                        lambda: shutil.rmtree({str(tmp_path)!r}),
                        lambda: os.rename({str(victim)!r}, 'stolen')):
            try:
                attempt()
                print('ESCAPED')
            except (PermissionError, OSError) as err:
                print('refused', type(err).__name__)
        open('inside.txt', 'w').write('fine')
        print(open('inside.txt').read())
    """
    result = run(code)
    assert result.passed, result.stderr
    assert "ESCAPED" not in result.stdout and result.stdout.count("refused") == 5 and "fine" in result.stdout
    assert victim.read_text() == "keep me" and not target.exists()


def test_no_secrets_are_inherited(monkeypatch):
    monkeypatch.setenv("JF_TEST_SECRET_TOKEN", "hunter2")
    result = run("import os\nprint(sorted(os.environ))\nassert 'JF_TEST_SECRET_TOKEN' not in os.environ")
    assert result.passed and "hunter2" not in result.stdout


def test_the_evaluation_goes_on_after_hostile_programs():
    results = [run(HOSTILE["fork bomb"]), run(HOSTILE["sleeps past the wall clock"]), run("print(6 * 7)")]
    assert [r.passed for r in results] == [False, False, True] and results[2].stdout == "42"
    assert results[1].status == "timeout"
