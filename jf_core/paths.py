"""Where the project keeps what it makes: `JF_HOME` if set, else ~/.cache/jacobi-forcing."""

from __future__ import annotations

import os
from pathlib import Path


def jf_home() -> Path:
    return Path(os.environ.get("JF_HOME", Path.home() / ".cache" / "jacobi-forcing")).expanduser()
