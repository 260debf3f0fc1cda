"""Checksums of the directories this project writes (model directories, training checkpoints), so a file that was
truncated, bit-flipped or edited after the write is refused with its name instead of loading as garbage weights.

The manifest is `checksums.sha256` in `sha256sum`'s own format (`<hex>  <relative path>` per line), written last
inside the temporary directory before its rename, so `sha256sum -c checksums.sha256` checks a directory by hand
too. It covers the weight and optimizer files (safetensors, torch pickles, distributed-checkpoint shards): the
bytes a silent corruption would turn into a wrong model, and which nothing rewrites. The JSON beside them
(config.json, whose `jacobi_forcing` block `jf tune` updates in place; markers; the tokenizer) is not listed: it
changes legitimately, and a damaged JSON fails to parse anyway. Directories without a manifest (written before it
existed, downloaded from a hub) load unchecked."""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST = "checksums.sha256"
PAYLOAD = (".safetensors", ".bin", ".pt", ".pth", ".distcp")


class CorruptFileError(ValueError):
    """A file of a checksummed directory is missing or does not match its checksum."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path) -> Path:
    """Checksum the weight files under `directory` into its manifest."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(PAYLOAD))
    lines = [f"{sha256_file(p)}  {p.relative_to(directory).as_posix()}\n" for p in files]
    out = directory / MANIFEST
    out.write_text("".join(lines))
    return out


def verify(directory: Path) -> bool:
    """Check `directory` against its manifest; False when it has none. Raises CorruptFileError naming the file."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return False
    for lineno, line in enumerate(manifest.read_text().splitlines(), start=1):
        expected, sep, name = line.partition("  ")
        if not sep or len(expected) != 64:
            raise CorruptFileError(f"{manifest}:{lineno}: not a sha256sum line")
        path = directory / name
        if not path.is_file():
            raise CorruptFileError(f"{path}: missing (listed in {MANIFEST})")
        actual = sha256_file(path)
        if actual != expected:
            raise CorruptFileError(
                f"{path}: checksum mismatch (sha256 {actual[:12]}..., {MANIFEST} says {expected[:12]}...): the file "
                "is corrupted or was changed after it was written; re-create it (re-run the stage, or delete the "
                "directory so the stage runs again)"
            )
    return True
