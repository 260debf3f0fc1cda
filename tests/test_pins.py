"""Every private name of a dependency the project uses is listed in jf_core/pins.py with the versions it was
written against: each exists in the installed version, the installed versions are the pinned ones (so the
refusal never fires here), pyproject.toml pins the same ranges, and another version is refused naming both."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from jf_core import pins

ROOT = Path(__file__).resolve().parents[1]


def _resolve(use: str):
    module, _, attribute = use.partition(":")
    found = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        found = getattr(found, part)
    return found


@pytest.mark.parametrize("name", sorted(pins.PINS))
def test_every_pinned_private_name_exists_in_the_installed_version(name):
    pin = pins.PINS[name]
    assert pins.supported(name), (name, importlib.metadata.version(pin.distribution), pin.versions)
    for use in pin.uses:
        try:
            _resolve(use)
        except AttributeError:
            pytest.fail(f"{use} is gone from {pin.distribution} {importlib.metadata.version(pin.distribution)}")


def test_the_standard_librarys_listed_private_names_exist():
    for use in pins.STDLIB:
        module, _, attribute = use.partition(":")
        owner, _, name = attribute.rpartition(".")
        holder = _resolve(f"{module}:{owner}") if owner else importlib.import_module(module)
        # an instance attribute (ArgumentParser._actions) exists on an instance
        assert hasattr(holder, name) or hasattr(holder(), name), use


def test_pyproject_pins_the_same_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    for pin in pins.PINS.values():
        distribution = pin.distribution
        found = [r for r in requirements if re.match(rf"{distribution}(\[[^]]*\])?[<>=!~]", r)]
        assert found, f"{distribution} is not required in pyproject.toml"
        for requirement in found:
            spec = re.sub(rf"^{distribution}(\[[^]]*\])?", "", requirement)
            if pin.refuse:  # a refused version must not be installable
                assert spec == pin.versions, (requirement, pin.versions)


FOLDERS = ("jf_core", "infra", "tasks", "flows", "jf_cli", "bench")
OURS = ("jf_core", "jf_cli", "jacobi_forcing", "tasks", "flows", "infra", "bench", "tests")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    return ast.unparse(node) in ("self", "cls")


def _attribute_by_name(node: ast.AST) -> str | None:
    """`x` of `getattr(obj, "x")` (hasattr, setattr), else None."""
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("getattr", "hasattr", "setattr")
        and len(node.args) > 1
    ):
        arg = node.args[1]
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return None


def _foreign_privates() -> dict[str, list[str]]:
    """Every private name of somebody else's that the code uses, with where: attributes (`config._x`, also through
    `getattr(x, "_x")`) that no code of ours defines, imports of private modules or names, and private methods
    overridden in a subclass of a dependency's class."""
    trees = {p: ast.parse(p.read_text()) for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
    own: set[str] = set()  # what our code defines: functions, classes, arguments, names, self/cls attributes
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
                own.add(node.attr)
    used: dict[str, list[str]] = {}
    for path, tree in trees.items():
        imported = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
                    if not node.module.startswith(OURS):
                        for part in [*node.module.split("."), alias.name]:
                            if _private(part):
                                used.setdefault(part, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                used.setdefault(node.attr, []).append(where)
            elif (name := _attribute_by_name(node)) and _private(name) and name not in own:
                used.setdefault(name, []).append(where)
            elif isinstance(node, ast.ClassDef):
                for base in node.bases:
                    module, name = imported.get(ast.unparse(base), ("", ""))
                    if not module or module.startswith(OURS):
                        continue
                    cls = getattr(importlib.import_module(module), name)
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and _private(item.name) and hasattr(cls, item.name):
                            used.setdefault(item.name, []).append(f"{where} (overrides {module}.{name})")
    return used


def test_the_private_names_in_the_code_are_the_pinned_ones():
    """A private name of a dependency (or of the standard library) used anywhere in the code is listed in
    jf_core/pins.py, and so checked against the installed version."""
    listed = {part for pin in pins.PINS.values() for use in pin.uses for part in re.split(r"[.:]", use)}
    listed |= {part for use in pins.STDLIB for part in re.split(r"[.:]", use)}
    used = _foreign_privates()
    assert {"_attn_implementation", "_run_uvicorn_command", "_exit"} <= set(used), "the scan finds what it should"
    assert {name: where for name, where in used.items() if name not in listed} == {}


def test_another_version_is_refused_naming_both(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "2.99.0" if d == "ray" else real(d))
    with pytest.raises(pins.UnsupportedVersion, match=r"ray 2\.99\.0 is installed.*ray>=2\.60,<2\.61"):
        pins.require("ray")
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "5.99.0" if d == "transformers" else real(d))
    assert pins.require("transformers-gguf-bar") is False  # cosmetic: skipped, not refused
