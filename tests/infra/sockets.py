"""What a process tree listens on, from the OS's socket table (psutil), sampled while it runs."""

from __future__ import annotations

import threading

import psutil

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


class SocketWatch:
    """Samples the listening sockets (TCP LISTEN, bound UDP) of a process and all its descendants until stopped."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.root, self.every = psutil.Process(pid), every
        self.seen: set[tuple[str, str, int]] = set()  # (process name, local ip, port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SocketWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = {p.pid: p for p in [self.root, *self.root.children(recursive=True)]}
            except psutil.NoSuchProcess:
                return
            for conn in psutil.net_connections(kind="inet"):
                listening = conn.status == psutil.CONN_LISTEN or (conn.type == 2 and not conn.raddr)
                if conn.pid in procs and listening and conn.laddr:
                    try:
                        name = procs[conn.pid].name()
                    except psutil.NoSuchProcess:
                        continue
                    self.seen.add((name, conn.laddr.ip, conn.laddr.port))
            self._stop.wait(self.every)

    def exposed(self) -> list[tuple[str, str, int]]:
        return sorted(s for s in self.seen if s[1] not in LOOPBACK)
