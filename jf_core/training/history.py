"""The training history's probes, typed. A history row is what MLflow logs (a flat mapping of metric names to
values per step), so a probe's figure has a name there; that name is made here, from the probe, and read back here,
to the probe: no other module composes or parses it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_KEY = re.compile(r"probe_tpf_n(\d+)")


@dataclass(frozen=True, order=True)
class TpfProbe:
    """Plain Jacobi's TPF at one block size on the probe's prompts, measured while training (round/training.py)."""

    block_size: int

    @property
    def key(self) -> str:
        """Its name in a history row and in MLflow (`probe_tpf_n16`)."""
        return f"probe_tpf_n{self.block_size}"

    @property
    def label(self) -> str:
        """How tables, plots and the fits' metric names call it (`n16`)."""
        return f"n{self.block_size}"

    @classmethod
    def of_key(cls, key: str) -> TpfProbe | None:
        """The probe a history key names; None for any other figure (a loss, the step)."""
        found = _KEY.fullmatch(key)
        return cls(int(found.group(1))) if found else None

    def points(self, history: Sequence[dict]) -> list[tuple[int, float]]:
        """(step, TPF) of each row that measured this probe."""
        return [(int(row["step"]), float(row[self.key])) for row in history if self.key in row]


def tpf_probes(history: Sequence[dict]) -> list[TpfProbe]:
    """The probes a history measured, by block size."""
    return sorted({p for row in history for key in row if (p := TpfProbe.of_key(key)) is not None})
