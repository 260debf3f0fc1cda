"""bench/packed_linear.py on the embedded model: both forms take their turns at every width and the table says so."""

from __future__ import annotations

import pytest

from jf_core.layers.packed import AVAILABLE


@pytest.mark.skipif(not AVAILABLE, reason="this torch build has no oneDNN")
def test_both_forms_are_timed_at_every_width(profile, capsys):
    from bench.packed_linear import main

    main(["--model", profile.model.path, "--widths", "1", "4", "--rounds", "2", "--repeats", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "round 2/2 done" in out and "packed speedup" in out
    rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(rows) == 2
    for row in rows:  # every figure is a measured time, none missing
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[1:6])
