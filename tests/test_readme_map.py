"""The README's map of modules ("What is here") matches the tree: every path it names exists, and every module of
the library and the orchestration layer is on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## What is here", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def _named(row: str) -> list[Path]:
    """The paths a row's first cell names; a bare file name is a sibling of the path before it."""
    cell = row.split(" | ")[0]
    out: list[Path] = []
    for token in re.findall(r"`([^`]+)`", cell):
        path = Path(token.rstrip("/"))
        if len(path.parts) == 1 and out:
            path = out[-1].parent / path
        out.append(path)
    return out


def test_every_path_on_the_map_exists():
    named = [p for row in _table() for p in _named(row)]
    assert len(named) > 20, "the table was read"
    assert [str(p) for p in named if not (ROOT / p).exists()] == []


def test_every_module_is_on_the_map():
    """Each module of jf_core and tasks by its own path, or inside a subpackage named on the map (whose row names
    its modules); the other folders as folders."""
    named = {p for row in _table() for p in _named(row)}
    modules = [
        p.relative_to(ROOT)
        for pattern in ("jf_core/*.py", "jf_core/*/", "tasks/*.py", "flows/", "jf_cli/", "jf_vllm/", "infra/", "bench/")
        for p in sorted(ROOT.glob(pattern))
        if p.name not in ("__init__.py", "__pycache__")
    ]
    roots = {Path("jf_core"), Path("tasks")}  # too broad to stand for their modules

    def on_map(module: Path) -> bool:
        return module in named or any(module.is_relative_to(p) for p in named if (ROOT / p).is_dir() and p not in roots)

    assert [str(m) for m in modules if not on_map(m)] == []
