"""The trajectory store: Parquet shards plus a JSON manifest, under one directory.

- A shard is written to a temporary name in the same directory, flushed, and renamed: a reader (or a retry after a
  crash) never sees half a shard. Its name carries its key, so a retry or a re-run rewrites the same file instead
  of adding a second one.
- Every record is validated before writing; every shard is checked on read (schema, content hash, records).
- The manifest lists shards with row counts and sha256 hashes; only one process (the driver) writes it, atomically.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jf_core.atomic import write_json_atomic, write_parquet_atomic
from jf_core.checksums import sha256_file
from jf_core.trajectory.schema import (
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    TrajectoryValidationError,
    check_schema,
    validate_record,
)

MANIFEST = "manifest.json"


class ShardWriteError(OSError):
    """A shard could not be written (disk full, quota, I/O error); its temporary file was removed."""


@dataclass
class ShardInfo:
    key: str
    file: str
    rows: int
    sha256: str
    prompts: int
    new_tokens: int
    seconds: float


def shard_file(key: str) -> str:
    return f"shard-{key}.parquet"


def write_shard(
    root: Path,
    key: str,
    records: list[dict],
    metadata: dict[str, str],
    *,
    prompts: int,
    new_tokens: int,
    seconds: float,
) -> ShardInfo:
    root.mkdir(parents=True, exist_ok=True)
    final = root / shard_file(key)
    for i, row in enumerate(records):
        validate_record(row, f"shard {final.name} row {i} (before write)")
    meta = {"jf.schema_version": SCHEMA_VERSION, **metadata}
    table = pa.Table.from_pylist(records, schema=TRAJECTORY_SCHEMA.with_metadata(meta))
    try:
        write_parquet_atomic(final, table, compression="zstd")
    except OSError as err:  # disk full, quota, file-size limit, I/O error: say where, keep nothing
        raise ShardWriteError(
            f"shard {final.name} could not be written to {root}: {err}. Nothing of it was kept; free space (or "
            "raise the quota) and re-run: finished shards are kept and the stage resumes from this one"
        ) from err
    return ShardInfo(
        key=key,
        file=final.name,
        rows=len(records),
        sha256=sha256_file(final),
        prompts=prompts,
        new_tokens=new_tokens,
        seconds=seconds,
    )


def read_shard(path: Path, *, expected_sha256: str | None = None, validate: bool = True) -> pa.Table:
    """Read and check one shard; a foreign, corrupted or tampered file raises TrajectoryValidationError naming it."""
    if not path.is_file():
        raise TrajectoryValidationError(f"shard {path} does not exist")
    if expected_sha256 is not None and sha256_file(path) != expected_sha256:
        raise TrajectoryValidationError(
            f"shard {path} does not match the manifest's content hash (changed or corrupted)"
        )
    try:
        table = pq.read_table(path)
    except Exception as err:  # ArrowInvalid, OSError, ...: all mean "not a readable Parquet file"
        raise TrajectoryValidationError(f"shard {path} is not a readable Parquet file: {err}") from err
    check_schema(table.schema, str(path))
    if validate:
        for i, row in enumerate(table.to_pylist()):
            validate_record(row, f"shard {path} row {i}")
    return table


class TrajectoryStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def manifest(self) -> dict:
        if not self.manifest_path.is_file():
            return {"schema_version": SCHEMA_VERSION, "shards": {}, "meta": {}}
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as err:
            raise TrajectoryValidationError(f"{self.manifest_path} is not valid JSON: {err}") from err

    def _write_manifest(self, manifest: dict) -> None:
        write_json_atomic(self.manifest_path, manifest, sort_keys=True)

    def is_done(self, key: str) -> bool:
        """A shard is done when the manifest lists it and its file still has the recorded hash."""
        info = self.manifest()["shards"].get(key)
        if info is None:
            return False
        path = self.root / info["file"]
        return path.is_file() and sha256_file(path) == info["sha256"]

    def commit(self, info: ShardInfo) -> None:
        manifest = self.manifest()
        manifest["shards"][info.key] = asdict(info)
        self._write_manifest(manifest)

    def set_meta(self, **meta) -> None:
        manifest = self.manifest()
        manifest.setdefault("meta", {}).update(meta)
        self._write_manifest(manifest)

    def shard_paths(self) -> list[Path]:
        return [
            self.root / info["file"] for info in sorted(self.manifest()["shards"].values(), key=lambda i: i["file"])
        ]

    def read(self, validate: bool = True) -> pa.Table:
        shards = sorted(self.manifest()["shards"].values(), key=lambda i: i["file"])
        if not shards:
            raise TrajectoryValidationError(f"{self.root} holds no trajectory shards (no {MANIFEST} or it lists none)")
        tables = []
        for info in shards:
            table = read_shard(self.root / info["file"], expected_sha256=info["sha256"], validate=validate)
            if table.num_rows != info["rows"]:
                raise TrajectoryValidationError(
                    f"shard {info['file']}: {table.num_rows} rows, manifest says {info['rows']}"
                )
            tables.append(table)
        return pa.concat_tables(tables)

    def answers(self) -> list[list[int]]:
        """Each prompt's answer from the model that collected the store: its blocks' fixed points in order, each
        through its length (reference answers, kind `text`, are not the model's and are left out). The shards' hashes
        are checked; their records were validated when the store was packed."""
        rows = (
            self.read(validate=False).select(["prompt_id", "block_index", "fixed_point", "length", "kind"]).to_pylist()
        )
        blocks: dict[str, dict[int, list[int]]] = {}
        for row in rows:
            if row["kind"] != "text":
                blocks.setdefault(row["prompt_id"], {})[row["block_index"]] = row["fixed_point"][: row["length"]]
        return [[t for j in sorted(b) for t in b[j]] for _, b in sorted(blocks.items())]

    def dataset(self):
        """The store as a `datasets.Dataset` (validated first)."""
        import datasets

        self.read()
        files = [str(p) for p in self.shard_paths()]
        return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(self.root / ".hf-cache"))
