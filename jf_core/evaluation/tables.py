"""A bench's rows as a terminal table, a Markdown table and a JSON file (the one writer of each: `jf bench decode`,
`jf eval` and the round's report print these)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from jf_core.evaluation.speed import MethodResult


def figure(x: float, decimals: int) -> str:
    """`x` to `decimals` places, or to two significant figures where those places would print a nonzero measurement
    as zero (a width-1 forward stalled by a busy machine makes a ratio of 0.004, which is not 0.00)."""
    fixed = f"{x:.{decimals}f}"
    return f"{x:.2g}" if x != 0 and float(fixed) == 0 else fixed


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


TABLE_COLUMNS = ("method", "TPF", "TPF p10/p50/p90", "TPS", "x HF gen", "x AR", "identical", "accuracy", "prefill s")


def table_rows(results: list[MethodResult]) -> list[list[str]]:
    rows = []
    for r in results:
        dist = "/".join(f"{_percentile(r.tpf_per_example, q):.2f}" for q in (0.1, 0.5, 0.9))
        rows.append(
            [
                r.name,
                f"{r.tpf:.2f}",
                dist,
                f"{r.tps:.1f}",
                f"{r.speedup_vs_hf_generate:.2f}",
                f"{r.speedup_vs_ar:.2f}",
                f"{r.identical_fraction:.3f}",
                "-" if r.accuracy is None else f"{r.accuracy:.3f}",
                "-" if r.prefill_seconds is None else f"{r.prefill_seconds:.3f}",
            ]
        )
    return rows


def format_table(results: list[MethodResult]) -> str:
    rows = [list(TABLE_COLUMNS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def markdown(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the one writer of every table the project prints or logs (bench rows, a round's metrics,
    the ablation, the mechanism check)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def format_markdown(results: list[MethodResult]) -> str:
    return markdown(TABLE_COLUMNS, table_rows(results))


def write_json(results: list[MethodResult], path: Path, meta: dict) -> None:
    from jf_core.atomic import write_json_atomic

    write_json_atomic(path, {"meta": meta, "methods": {r.name: asdict(r) for r in results}})
