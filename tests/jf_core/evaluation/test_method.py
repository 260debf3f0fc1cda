"""A table row's identity is typed: its label is written in one place (`Method.label`) and nothing reads one back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jf_core.evaluation.method import AR, TUNED, Method, jacobi

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ["jf_core", "tasks", "flows", "jf_cli", "infra", "bench", "jf_vllm"]
HOME = ROOT / "jf_core" / "evaluation" / "method.py"
# Pieces only a label has: a string holding one outside method.py builds or parses a label by hand.
LABEL_PIECES = ("jacobi_n", "jf_ar", "jf_jacobi", "_full_width", "jf_autotuned", "jf_tuned")
# A row asked for by a literal label (`methods["tuned"]`, `tps["ar"]`) instead of by its Method.
ROW_NAMES = {"ar", "tuned", "autotuned", "hf_generate", "hf_prompt_lookup", "recycling", "multiblock"}
ROW_HOLDERS = ("methods", "tps", "rows", "results", "by_name")


def test_labels_are_derived_from_the_fields():
    assert [
        m.label
        for m in (
            AR,
            TUNED,
            jacobi(16),
            AR.of("jf"),
            Method("autotuned", model="jf", full_width=True),
            Method("lookup", block_size=8, model="jf"),
        )
    ] == [
        "ar",
        "tuned",
        "jacobi_n16",
        "jf_ar",
        "jf_autotuned_full_width",
        "jf_lookup_n8",
    ]
    assert jacobi(8, "base") == jacobi(8).of("base") and len({jacobi(8), jacobi(8), jacobi(16)}) == 2
    assert not Method("hf_generate").ours and jacobi(4).ours


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "jacobi"}, "block size"),
        ({"kind": "ar", "block_size": 16}, "block size"),
        ({"kind": "lookup"}, "block size"),
        ({"kind": "ar", "full_width": True}, "full_width"),
        ({"kind": "ar", "model": "jf/x"}, "model tag"),
    ],
)
def test_a_method_that_cannot_be_a_row_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Method(**fields)


def _strings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _literal_rows(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript):
            continue
        key, holder = node.slice, node.value
        name = holder.attr if isinstance(holder, ast.Attribute) else getattr(holder, "id", "")
        if isinstance(key, ast.Constant) and key.value in ROW_NAMES and name.endswith(ROW_HOLDERS):
            yield node.lineno, f"{name}[{key.value!r}]"


def test_no_label_is_written_or_read_outside_the_method_type():
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == HOME:
                continue
            tree = ast.parse(path.read_text())
            where = path.relative_to(ROOT)
            found += [
                f"{where}:{line} {text!r}" for line, text in _strings(tree) if any(p in text for p in LABEL_PIECES)
            ]
            found += [f"{where}:{line} {text}" for line, text in _literal_rows(tree)]
    assert not found, "method labels by hand (ask by Method, read its fields):\n" + "\n".join(found)


def test_the_scan_sees_a_label_parsed_back():
    bad = ast.parse('import re\nm = re.match(r"^(jf_)?jacobi_n(\\d+)$", r.name)\nx = result.methods["tuned"]')
    assert [t for _, t in _strings(bad) if any(p in t for p in LABEL_PIECES)]
    assert list(_literal_rows(bad)) == [(3, "methods['tuned']")]
