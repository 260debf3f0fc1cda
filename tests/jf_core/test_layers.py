"""jf_core's lower packages import only what lies below them, so each can be read (and changed) without the ones
above: a model directory knows no decoder, the decoders know no server."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "jf_core"
# Bottom up: each may import only those before it (module-level and function-local imports alike).
LOWER = ["checksums", "paths", "threads", "quiet", "model_dir", "decoding", "models", "training", "serving"]


def _arrows() -> dict[str, set[str]]:
    """jf_core's package-level import graph: `decoding` for jf_core/decoding/*, `models` for jf_core/models.py."""
    arrows: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                parts = name.removeprefix("jacobi_forcing.").split(".")
                if parts[0] == "jf_core" and len(parts) > 1 and parts[1] != src:
                    arrows.setdefault(src, set()).add(parts[1])
    return arrows


def test_lower_packages_import_only_what_lies_below():
    arrows = _arrows()
    assert arrows["serving"], "the graph was read"
    upward = {f"{pkg} -> {dst}" for i, pkg in enumerate(LOWER) for dst in arrows.get(pkg, ()) if dst not in LOWER[:i]}
    assert upward == set()


def test_nothing_in_the_library_depends_on_the_server():
    arrows = _arrows()
    assert sorted(pkg for pkg, dsts in arrows.items() if "serving" in dsts) == []


def test_the_decoding_front_door_exports_what_it_names():
    import jf_core.decoding as decoding

    assert sorted(decoding.__all__) == sorted(decoding._EXPORTS)
    for name in decoding.__all__:
        assert getattr(decoding, name) is not None
