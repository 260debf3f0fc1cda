"""The trajectory record: one row per prompt x block, as an Arrow schema, with its invariants.

| column        | type                | meaning                                                                     |
|---------------|---------------------|-----------------------------------------------------------------------------|
| prompt_id     | string              | the prompt's id in its source                                               |
| round_id      | string              | the round that generated it                                                 |
| block_index   | int32               | block j of this prompt's generation (0-based)                               |
| n             | int32               | block size                                                                  |
| prompt_ids    | list<int32>         | the prompt's token ids (the clean prefix of block j is prompt_ids + the     |
|               |                     | fixed points of blocks 0..j-1, truncated to their lengths)                  |
| states        | list<list<int32>>   | the block's draft states, each n tokens: the initial draft first, then one  |
|               |                     | per Jacobi iteration, the fixed point last                                  |
| fixed_point   | list<int32>         | the converged block: greedy AR's tokens; pad after EOS                      |
| length        | int32               | valid tokens of the fixed point: n, or through EOS for the last block       |
| iterations    | int32               | Jacobi iterations to reach the fixed point (= len(states) - 1)              |
| model_hash    | string              | content hash of the model that generated it                                 |
| seed          | int64               | draft seed                                                                  |
| kind          | string              | `jacobi`: states recorded by Jacobi decoding; `synthetic`: the fixed point  |
|               |                     | from greedy AR and its states made by corrupting the block's tail           |
|               |                     | (synthetic.py), `iterations` then counting the corrupted states; `text`:    |
|               |                     | the same on the prompt file's reference answer                              |

Shard-level key/value metadata carries `jf.schema_version`, `jf.model_id` and `jf.generation_config` (JSON).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "2"  # 2: the `kind` column
KINDS = ("jacobi", "synthetic", "text")

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("round_id", pa.string(), nullable=False),
        pa.field("block_index", pa.int32(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("states", pa.list_(pa.list_(pa.int32())), nullable=False),
        pa.field("fixed_point", pa.list_(pa.int32()), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
        pa.field("iterations", pa.int32(), nullable=False),
        pa.field("model_hash", pa.string(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
    ]
)


class TrajectoryValidationError(ValueError):
    pass


def validate_record(row: dict, where: str) -> None:
    """Check one record's invariants; raise naming `where` (file, row) and the broken rule."""

    def fail(rule: str) -> None:
        raise TrajectoryValidationError(
            f"{where}: {rule} (prompt_id={row.get('prompt_id')!r}, block={row.get('block_index')})"
        )

    n, states, fixed, length = row["n"], row["states"], row["fixed_point"], row["length"]
    if n < 1:
        fail(f"n must be >= 1, got {n}")
    if not states:
        fail("no draft states")
    if len(fixed) > n or any(len(s) != len(fixed) for s in states):
        fail(f"every state and the fixed point must have the block's length ({len(fixed)} <= n={n})")
    if not 1 <= length <= len(fixed):
        fail(f"length {length} outside [1, {len(fixed)}]")
    if states[-1] != fixed:
        fail("the last state is not the fixed point")
    if states[0][0] != fixed[0]:
        fail("the initial draft does not start with the block's known first token")
    if row["iterations"] != len(states) - 1:
        fail(f"iterations {row['iterations']} != len(states) - 1 = {len(states) - 1}")
    if not row["prompt_ids"]:
        fail("empty prompt_ids")
    if row["kind"] not in KINDS:
        fail(f"kind {row['kind']!r} is not one of {KINDS}")


def check_schema(schema: pa.Schema, where: str) -> None:
    """A foreign shard (other columns or types, or no jf metadata) is rejected by name."""
    actual = pa.schema([f.with_nullable(False) for f in schema]).remove_metadata()
    if not actual.equals(TRAJECTORY_SCHEMA):
        missing = set(TRAJECTORY_SCHEMA.names) - set(schema.names)
        extra = set(schema.names) - set(TRAJECTORY_SCHEMA.names)
        detail = (
            f"missing columns {sorted(missing)}, unexpected {sorted(extra)}"
            if missing or extra
            else "column types differ"
        )
        raise TrajectoryValidationError(f"{where} is not a jf trajectory shard: {detail}")
    meta = schema.metadata or {}
    if meta.get(b"jf.schema_version") != SCHEMA_VERSION.encode():
        raise TrajectoryValidationError(
            f"{where} has trajectory schema version {meta.get(b'jf.schema_version')!r}, expected {SCHEMA_VERSION!r}: "
            "generate its trajectories again"
        )
