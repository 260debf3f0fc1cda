from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.trajectory.schema import TrajectoryValidationError
from jf_core.trajectory.store import TrajectoryStore, read_shard, write_shard


def record(prompt_id="p0", block=0, n=4):
    fixed = [5, 6, 7, 8][:n]
    return {
        "prompt_id": prompt_id,
        "round_id": "r0",
        "block_index": block,
        "n": n,
        "prompt_ids": [1, 2, 3],
        "states": [[5, 9, 9, 9][:n], [5, 6, 9, 9][:n], fixed],
        "fixed_point": fixed,
        "length": n,
        "iterations": 2,
        "model_hash": "abc",
        "seed": 0,
        "kind": "jacobi",
    }


def write(root, key="k1", records=None):
    records = records if records is not None else [record("p0", 0), record("p0", 1), record("p1", 0)]
    return write_shard(root, key, records, {"jf.model_id": "m"}, prompts=2, new_tokens=12, seconds=0.1)


def test_round_trip_with_pyarrow_and_datasets(tmp_path):
    store = TrajectoryStore(tmp_path)
    store.commit(write(tmp_path))
    table = store.read()
    assert table.num_rows == 3 and table.column("states").to_pylist()[0] == [[5, 9, 9, 9], [5, 6, 9, 9], [5, 6, 7, 8]]
    ds = store.dataset()
    assert len(ds) == 3 and ds[2]["prompt_id"] == "p1" and ds[0]["fixed_point"] == [5, 6, 7, 8]
    assert store.is_done("k1") and not store.is_done("k2")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".parquet") == ["shard-k1.parquet"]


def test_answers_join_each_prompts_fixed_points_through_their_lengths_and_leave_reference_text_out(tmp_path):
    last = {**record("p0", 1), "fixed_point": [7, 1, 0, 0], "length": 2, "states": [[7, 1, 0, 0]], "iterations": 0}
    text = {**record("p2", 0), "kind": "text"}
    store = TrajectoryStore(tmp_path)
    store.commit(write(tmp_path, records=[last, record("p1", 0), text, record("p0", 0)]))
    assert store.answers() == [[5, 6, 7, 8, 7, 1], [5, 6, 7, 8]]


def test_invalid_record_leaves_nothing(tmp_path):
    bad = record()
    bad["states"][-1] = [5, 6, 7, 0]
    with pytest.raises(TrajectoryValidationError, match="last state is not the fixed point"):
        write(tmp_path, records=[record(), bad])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("length", 0, "length 0 outside"),
        ("iterations", 5, "iterations 5"),
        ("states", [], "no draft states"),
        ("states", [[9, 6, 7, 8], [5, 6, 7, 8]], "initial draft"),
        ("kind", "masked", "kind 'masked' is not one of"),
    ],
)
def test_record_rules(tmp_path, field, value, message):
    bad = record()
    bad[field] = value
    with pytest.raises(TrajectoryValidationError, match=message):
        write(tmp_path, records=[bad])


def test_corrupted_shard_is_named(tmp_path):
    info = write(tmp_path)
    path = tmp_path / info.file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TrajectoryValidationError, match=f"{info.file} is not a readable Parquet file"):
        read_shard(path)
    store = TrajectoryStore(tmp_path)
    store.commit(info)
    with pytest.raises(TrajectoryValidationError, match="content hash"):
        store.read()
    assert not store.is_done(info.key)


def test_foreign_shard_is_named(tmp_path):
    pq.write_table(pa.table({"prompt_id": ["x"], "text": ["hello"]}), tmp_path / "foreign.parquet")
    with pytest.raises(
        TrajectoryValidationError, match=r"foreign\.parquet is not a jf trajectory shard: missing columns"
    ):
        read_shard(tmp_path / "foreign.parquet")


def test_empty_store_is_an_error(tmp_path):
    with pytest.raises(TrajectoryValidationError, match="no trajectory shards"):
        TrajectoryStore(tmp_path).read()


DISK_FULL = """
import os, resource, signal, sys
from jf_core.trajectory.store import ShardWriteError, TrajectoryStore, write_shard
from tests.jf_core.trajectory.test_store import record

root, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, like ENOSPC
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # after the imports: .pyc files stay writable
store = TrajectoryStore(root)
for key, rows in (("a", 2), ("b", 2), ("c", 1000)):
    if store.is_done(key):
        continue
    records = [record(f"{key}{i}-{os.urandom(16).hex()}", 0) for i in range(rows)]  # ids zstd cannot shrink
    try:
        store.commit(write_shard(store.root, key, records, {"jf.model_id": "m"}, prompts=rows, new_tokens=4 * rows,
                                 seconds=0.1))
    except ShardWriteError as err:
        print(err)
        sys.exit(3)
"""


@pytest.mark.faults
def test_a_full_disk_during_shard_writes_keeps_nothing_partial_and_the_rerun_completes(tmp_path):
    """The kernel refuses writes past a file-size limit (RLIMIT_FSIZE) in the writing process, as a full disk
    would: the shard that did not fit fails with a clear error, no partial shard or temporary file is visible, and
    a re-run with room writes only the missing shard."""
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "traj"
    repo = Path(__file__).resolve().parents[3]

    def run(limit: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", DISK_FULL, str(root), str(limit)], cwd=repo, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    full = run(8_000)
    assert full.returncode == 3, full.stdout + full.stderr
    assert "shard shard-c.parquet could not be written to" in full.stdout and "File too large" in full.stdout
    assert "Nothing of it was kept" in full.stdout
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json", "shard-a.parquet", "shard-b.parquet"]
    first = {k: v["sha256"] for k, v in TrajectoryStore(root).manifest()["shards"].items()}

    again = run(0)
    assert again.returncode == 0, again.stdout + again.stderr
    store = TrajectoryStore(root)
    shards = store.manifest()["shards"]
    assert sorted(shards) == ["a", "b", "c"] and {k: shards[k]["sha256"] for k in first} == first  # a, b not redone
    ids = store.read().column("prompt_id").to_pylist()
    assert len(ids) == len(set(ids)) == 1004  # every row exactly once


def test_a_shard_of_the_schema_before_kinds_is_refused_by_name(tmp_path):
    """Schema 1 had no `kind` column: such a shard is named and refused, not read as Jacobi data by guess."""
    from jf_core.trajectory.schema import TRAJECTORY_SCHEMA

    old = pa.schema([f for f in TRAJECTORY_SCHEMA if f.name != "kind"], metadata={"jf.schema_version": "1"})
    rows = [{k: v for k, v in record().items() if k != "kind"}]
    pq.write_table(pa.Table.from_pylist(rows, schema=old), tmp_path / "old.parquet")
    with pytest.raises(
        TrajectoryValidationError, match=r"old.parquet is not a jf trajectory shard: missing columns \['kind'\]"
    ):
        read_shard(tmp_path / "old.parquet")
