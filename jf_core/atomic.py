"""Files written whole or not at all: the one way this project writes a file that something else reads.

A writer writes under a temporary name in the destination's directory (the same filesystem, so the rename is atomic)
and renames it over the destination only once the file is complete: a reader, a resumed stage or a killed process
sees the old file or the new one, never half of one, and a failure leaves no temporary file behind. Directories
that are swapped whole (a model directory, a checkpoint) use the same rule with their own rename; see
`tests/jf_core/test_atomic.py` for where each lives.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path, *, fsync: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed to `path` when the block ends without an error, removed
    when it raises. `fsync`: the file's bytes reach the disk before the rename (a shard that must survive a crash of
    the machine, not only of the process)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if fsync:
            with tmp.open("rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temporary directory beside `path` to fill; renamed to `path` (which must not exist yet) when the block ends
    without an error, removed with what it holds when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, data: Any, **dump) -> None:
    """`data` as JSON at `path` (indented, unknown types as text unless `dump` says otherwise)."""
    write_text_atomic(path, json.dumps(data, **{"indent": 2, "default": str, **dump}) + "\n")


def write_parquet_atomic(path: str | Path, table: Any, **options) -> None:
    """A pyarrow table as a parquet file at `path`, its bytes on disk before it takes the name."""
    import pyarrow.parquet as pq

    with atomic_path(path, fsync=True) as tmp:
        pq.write_table(table, tmp, **options)
