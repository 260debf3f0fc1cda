"""The wheel: what it installs into a user's site-packages, and that it runs without the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Source folder -> the package path it installs as.
LAYOUT = {
    "jf_core": "jf_core",
    "jf_cli": "jf_cli",
    "jf_vllm": "jf_vllm",
    "tasks": "jacobi_forcing/tasks",
    "flows": "jacobi_forcing/flows",
    "infra": "jacobi_forcing/infra",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the build reads: setuptools would otherwise reuse a stale build/ in the checkout.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in LAYOUT:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("jacobi_forcing-*.whl")
    return path


def test_the_wheel_installs_no_generic_top_level_modules(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"jf_core", "jf_cli", "jf_vllm", "jacobi_forcing"}


def test_every_source_module_and_profile_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for src, dest in LAYOUT.items():
        for f in (REPO / src).rglob("*"):
            if f.suffix in {".py", ".yaml", ".json"} and "__pycache__" not in f.parts:
                expected.add(f"{dest}/{f.relative_to(REPO / src).as_posix()}")
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel (add the package to pyproject's [tool.setuptools] packages): {missing}"


@pytest.mark.slow
def test_the_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    """Installed into its own folder and imported from elsewhere, with this checkout's editable finder removed: the
    orchestration imports itself by its namespace, and plain `tasks` does not exist."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = f"""
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
import jacobi_forcing.tasks.registry, jacobi_forcing.flows.round, jacobi_forcing.infra.serve_app, jf_cli.main, jf_core
for m in (jacobi_forcing.tasks.registry, jacobi_forcing.flows.round, jacobi_forcing.infra.serve_app, jf_core):
    assert m.__file__.startswith({str(target)!r}), m.__file__
assert importlib.util.find_spec("tasks") is None and importlib.util.find_spec("infra") is None
from jf_core.config import load_profile
load_profile("tiny")
"""
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
