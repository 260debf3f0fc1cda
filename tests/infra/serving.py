"""Starting `jf serve` as a user does, for the tests that talk to it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from jacobi_forcing.infra.stack import free_port


def spawn_jf_serve(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`jf serve ARGS --port <free>` in a child, its output piped; returns it and its URL (not yet serving)."""
    port = free_port()
    jf = Path(sys.executable).parent / "jf"
    command = [str(jf), "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 300) -> None:
    """Until /health answers 200. A child that exits first fails the caller with its output; so does one that
    stays silent past `timeout` (it is killed)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"jf serve exited with {proc.returncode}: {proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"jf serve did not answer /health within {timeout:.0f} s")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
