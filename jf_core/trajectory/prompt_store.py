"""Prompt files added after a profile was written (`jf prompts add`): validated, then kept content-addressed under
`$JF_HOME/prompts/added/<collection>/`, so the URI an event carries names exactly the bytes that were checked, and
adding the same file twice is one file. A round merges such a file into its profile's prompts with
`prompts.extra_sources` (jf_core/trajectory/prompts.py)."""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from jf_core.atomic import atomic_path
from jf_core.paths import jf_home
from jf_core.trajectory.prompt_source import PromptSourceConfig
from jf_core.trajectory.prompts import PromptSourceError, read_rows


@dataclass(frozen=True)
class AddedPrompts:
    uri: str  # the stored file
    rows: int  # rows with a usable prompt field
    sha256: str
    new: bool  # False: this content was already stored


def added_dir(collection: str, home: Path | None = None) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", collection):
        raise PromptSourceError(f"collection {collection!r}: use letters, digits, '.', '_' and '-' only")
    return (home or jf_home()) / "prompts" / "added" / collection


def count_prompts(path: Path, source: PromptSourceConfig) -> int:
    """Rows of `path` whose prompt field (the source's text or messages field) is present and non-empty; raises
    PromptSourceError naming the file when it cannot be read or holds none."""
    cfg = source.model_copy(update={"source": str(path), "limit": None, "extra_sources": []})
    field = cfg.messages_field or cfg.text_field
    usable = 0
    for _, row in read_rows(cfg):
        value = row.get(field)
        usable += bool(value.strip()) if isinstance(value, str) else bool(isinstance(value, list) and value)
    if usable == 0:
        raise PromptSourceError(f"prompt file {path}: no row has a non-empty {field!r} field")
    return usable


def add_prompt_file(
    src: str | Path, collection: str, source: PromptSourceConfig, home: Path | None = None
) -> AddedPrompts:
    """Validate `src` as prompts of `source`'s shape and store it atomically (temporary name, then rename)."""
    path = Path(src).expanduser()
    if not path.is_file():
        raise PromptSourceError(f"prompt file {path} does not exist")
    if not path.name.lower().endswith((".jsonl", ".jsonl.gz", ".json.gz", ".parquet")):
        raise PromptSourceError(f"prompt file {path}: expected .jsonl, .jsonl.gz or .parquet")
    rows = count_prompts(path, source)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    out_dir = added_dir(collection, home)
    out = out_dir / f"{digest[:12]}-{path.name}"
    if out.is_file():
        return AddedPrompts(str(out), rows, digest, new=False)
    with atomic_path(out) as tmp:
        shutil.copyfile(path, tmp)
    return AddedPrompts(str(out), rows, digest, new=True)
