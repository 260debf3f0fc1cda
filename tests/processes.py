"""A server a test starts in a session of its own: waited for until its URL answers, then stopped with its whole
process group."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until `url` answers 2xx. A server that exits first fails the caller with its log; so does one still silent
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        # Not listening yet, not ready (an HTTPError is an OSError too), or not this server: another process that
        # took the port answers in its own protocol, and this server exits on its bind (then its log fails the caller).
        except (OSError, http.client.HTTPException):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{url} did not answer within {timeout:.0f} s"
            time.sleep(1)


def stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM to the server's process group, SIGKILL when it has not exited after `timeout` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
