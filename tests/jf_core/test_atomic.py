"""Files are written whole or not at all, and by one writer (jf_core/atomic.py): a second, hand-made
temporary-then-rename fails the scan below unless it swaps a whole directory, where it says so."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.atomic import atomic_path, write_json_atomic, write_parquet_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["jf_core", "tasks", "flows", "jf_cli", "infra", "bench", "jf_vllm"]
# Whole directories put in place by a rename of their own (a file's writer cannot do it): file -> what it swaps.
DIRECTORY_SWAPS = {
    "jf_core/atomic.py": "the writer itself",
    "jf_core/model_dir.py": "a model directory (save_checkpoint)",
    "jf_core/training/parallel.py": "a sharded checkpoint directory, written by every worker",
    "jf_core/trajectory/prepare.py": "a prepared prompt store (train, calib and manifest together)",
    "tasks/model_package.py": "a registry model downloaded into the model cache",
}


def test_a_file_appears_whole_and_a_failed_write_leaves_the_old_one_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "state.json"
    write_json_atomic(path, {"step": 1})
    assert json.loads(path.read_text()) == {"step": 1}
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text('{"step": 2')  # half written, then the writer dies
        raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"step": 1}
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]
    write_text_atomic(path, "x")
    table = pa.table({"a": [1, 2]})
    write_parquet_atomic(tmp_path / "t.parquet", table)
    assert pq.read_table(tmp_path / "t.parquet").equals(table) and path.read_text() == "x"


def _renames(path: Path) -> list[str]:
    """The calls in `path` that put a file in place by hand: mkstemp, os.replace/os.rename, and `.rename(...)` /
    `.replace(x)` on a name that reads as a temporary (`tmp`, `partial`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f, owner = node.func, ast.unparse(node.func.value)
        by_hand = f.attr == "mkstemp" or (owner == "os" and f.attr in {"replace", "rename"})
        one_path = f.attr in {"rename", "replace"} and len(node.args) == 1 and not node.keywords
        if by_hand or (one_path and (f.attr == "rename" or any(w in owner.lower() for w in ("tmp", "partial")))):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(f)}")
    return found


def test_no_file_is_put_in_place_by_a_second_writer():
    found = [hit for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py")) for hit in _renames(path)]
    assert found, "the scan reads the tree"
    stray = [hit for hit in found if hit.split(":")[0] not in DIRECTORY_SWAPS]
    assert stray == [], "write through jf_core/atomic.py (or name the directory swap in DIRECTORY_SWAPS)"
    assert {hit.split(":")[0] for hit in found} == set(DIRECTORY_SWAPS), "an entry of DIRECTORY_SWAPS is stale"
