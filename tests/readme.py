"""The READMEs as tests read them: their fenced blocks, the shell lines in those blocks, a marked snippet, and a
line run as written from another directory."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The READMEs and the documentation site's pages, the experiment records included: every command and snippet in any
# of them is held to the same tests.
READMES = ("README.md", "infra/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))


def blocks(lang: str) -> list[tuple[str, str]]:
    """(readme, body) of every fenced block in `lang`."""
    out = []
    for name in READMES:
        text = (ROOT / name).read_text()
        out += [(name, body) for tag, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if tag == lang]
    return out


def command_lines(body: str) -> list[str]:
    """Shell lines of a block with continuations joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [line.split(" #", 1)[0].strip() for line in joined.splitlines() if not line.lstrip().startswith("#")]
    return [line for line in lines if line]


def lines_with(text: str) -> list[str]:
    """Every shell line of the READMEs that contains `text`, in order."""
    return [line for _, body in blocks("bash") for line in command_lines(body) if text in line]


def snippet(marker: str) -> str:
    """The Python block after `<!-- marker -->` in the READMEs or the docs (the first that has it)."""
    for name in READMES:
        found = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", (ROOT / name).read_text(), re.S)
        if found:
            return found.group(1)
    raise AssertionError(f"no README or docs page has a <!-- {marker} --> python block")


def run_as_written(line: str, cwd: Path, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """A README line through bash from `cwd`: its `.venv/bin/` is the repository's, the rest as written."""
    command = line.replace(".venv/bin/", f"{ROOT}/.venv/bin/", 1)
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)
