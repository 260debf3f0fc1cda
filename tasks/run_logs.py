"""jf_core's log records in the Prefect run's log.

jf_core is a library: what it has to say while a stage runs (training's thread count against a busy machine) it
logs under `jf.*`, and prints nothing. A task that runs such a stage forwards those records, from warnings up, to its
run logger for the stage's duration, so they read like the task's own lines in the terminal and in the Prefect UI;
a worker's stderr, where a bare record would go, is read by nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger


class _ToRunLogger(logging.Handler):
    def __init__(self, run_logger: logging.LoggerAdapter, level: int) -> None:
        super().__init__(level)
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        self.run_logger.log(record.levelno, "%s", record.getMessage())


@contextmanager
def library_warnings_in_run_log(name: str = "jf", level: int = logging.WARNING) -> Iterator[None]:
    """Inside a task or flow run: records of logger `name` at `level` or above go to the run's log, and only
    there (not also to the root logger's console handler, which would print them a second time)."""
    library = logging.getLogger(name)
    handler = _ToRunLogger(get_run_logger(), level)
    propagate = library.propagate
    library.addHandler(handler)
    library.propagate = False
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.propagate = propagate
