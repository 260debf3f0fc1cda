"""tasks/ holds only what needs the orchestration stack: each module imports Prefect, Ray or MLflow. Library code
(no such import) belongs in jf_core, where the CLI and other consumers reach it without the stack."""

from __future__ import annotations

import ast
from pathlib import Path

TASKS = Path(__file__).resolve().parents[2] / "tasks"
STACK = ("prefect", "ray", "mlflow", "jacobi_forcing.infra.ray_cluster")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_task_module_needs_the_stack():
    modules = [p for p in sorted(TASKS.glob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 5, "the folder was read"
    plain = [p.name for p in modules if not any(m == s or m.startswith(f"{s}.") for m in _imports(p) for s in STACK)]
    assert plain == []
