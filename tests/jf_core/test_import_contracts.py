"""Every jf_core package imports only what lies below it, so each can be read (and changed) without the ones above
and no two packages import each other: a model directory knows no decoder, the decoders know no server, the
embedded task knows no evaluation, and the evaluation knows no round. The rules are import-linter contracts in
pyproject.toml; this file runs them, shows them bite, and keeps the checks no contract type expresses."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "jf_core"
PYPROJECT = ROOT.parent / "pyproject.toml"


def _contracts() -> dict[str, dict]:
    import tomllib

    return {c["id"]: c for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]}


def _lint_imports(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """import-linter on `cwd`'s pyproject.toml, as CI runs it."""
    exe = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_circle_and_server_contracts_hold():
    """pyproject.toml's [tool.importlinter] contracts: every jf_core package imports only the ones below it (module
    level, function-local and type checking imports alike, indirect chains included), nothing in the library
    reaches the server, and no modules or packages of jf_core, jf_cli and jf_vllm import each other round a circle."""
    done = _lint_imports(ROOT.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


def test_every_jf_core_package_has_a_layer():
    """A package left out of the layers contract would be unconstrained: the contract names them all."""
    layers = _contracts()["jf-core-layers"]["layers"]
    packages = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()} - {"__init__"}
    assert set(layers) == packages and len(layers) == len(packages)


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    """The contracts bite: a copy of the library whose lowest module imports the round inside a function (the kind
    of import a reader misses) is refused, naming the import."""
    shutil.copytree(ROOT, tmp_path / "jf_core", ignore=shutil.ignore_patterns("__pycache__", "embedded"))
    for name in ("jf_cli", "jf_vllm"):
        shutil.copytree(ROOT.parent / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    pins = tmp_path / "jf_core" / "pins.py"
    pins.write_text(pins.read_text() + "\n\ndef _probe():\n    from jf_core.round import stages\n\n    return stages\n")
    done = _lint_imports(tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0 and "every jf_core package imports only the ones below it BROKEN" in done.stdout
    assert "jf_core.pins -> jf_core.round.stages" in done.stdout


def test_the_decoding_front_door_exports_what_it_names():
    import jf_core.decoding as decoding

    assert sorted(decoding.__all__) == sorted(decoding._EXPORTS)
    for name in decoding.__all__:
        assert getattr(decoding, name) is not None


def _module_graph() -> dict[str, set[str]]:
    """Every module of the project's packages -> the project's modules it imports (any import: module-level,
    function-local or for type checking), a package's own `__init__` left out of its modules' edges."""
    repo = ROOT.parent
    modules = {}
    for pkg in ("jf_core", "jf_vllm", "jf_cli", "tasks", "flows", "infra"):
        for path in (repo / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for target in (t.removeprefix("jacobi_forcing.") for t in targets):
                if target in modules and target != name and not name.startswith(f"{target}."):
                    graph[name].add(target)
    return graph


def test_no_modules_import_each_other_round_a_circle():
    """No import circle, of two modules or more, anywhere in the project (Tarjan's strongly connected components).
    import-linter's acyclic contract covers jf_core, jf_cli and jf_vllm; tasks, flows and infra install under the
    setuptools-mapped `jacobi_forcing` namespace, which its graph cannot read, so this graph of every package stays."""
    graph = _module_graph()
    assert sum(map(len, graph.values())) > 300, "the graph was read"
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own: another module that needs it gets a public one."""
    repo = ROOT.parent
    found = []
    for pkg in ("jf_core", "jf_vllm", "jf_cli", "tasks", "flows", "infra", "bench"):
        for path in (repo / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    ours = node.module.removeprefix("jacobi_forcing.").split(".")[0] in {
                        "jf_core", "jf_vllm", "jf_cli", "tasks", "flows", "infra", "bench",
                    }  # fmt: skip
                    private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    if ours and private:
                        found.append(f"{path.relative_to(repo)}:{node.lineno} {node.module}: {', '.join(private)}")
    assert found == []


def test_outside_decoding_its_exported_names_come_through_the_front_door():
    """`from jf_core.decoding import decode, JacobiConfig, ...` everywhere outside the package: the front door's names
    are never imported from the submodule that defines them (the submodules' other names, the specialists' tools,
    are imported from where they live)."""
    import jf_core.decoding as decoding

    repo = ROOT.parent
    found = []
    for pkg in ("jf_core", "jf_vllm", "jf_cli", "tasks", "flows", "infra", "bench"):
        for path in (repo / pkg).rglob("*.py"):
            if path.is_relative_to(ROOT / "decoding"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jf_core.decoding."):
                    sub = node.module.split(".")[2]
                    names = [a.name for a in node.names if decoding._EXPORTS.get(a.name) == sub]
                    if names:
                        found.append(f"{path.relative_to(repo)}:{node.lineno} {node.module}: {', '.join(names)}")
    assert found == []


LONGEST_FUNCTION = 80  # lines, signature and docstring included
LONG_MODULE = 350


def test_functions_are_short_and_a_long_module_says_why():
    """A newcomer reads a function whole: none in jf_core reaches 80 lines. A module past 350 lines says in its
    docstring why it is one module ("Why one module of N lines: ...")."""
    long_functions, silent_modules = [], []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= LONGEST_FUNCTION:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
        doc = ast.get_docstring(tree) or ""
        if len(text.splitlines()) > LONG_MODULE and "Why " not in doc:
            silent_modules.append(str(path.relative_to(ROOT)))
    assert not long_functions, long_functions
    assert not silent_modules, f"modules over {LONG_MODULE} lines with no reason in their docstring: {silent_modules}"
