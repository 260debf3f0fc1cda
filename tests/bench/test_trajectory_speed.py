"""bench/trajectory_speed.py on the tiny profile: each kind runs on both KV caches, taking turns, and the in-place
cache's answers are the concatenating one's."""

from __future__ import annotations


def test_both_caches_take_turns_and_give_the_same_answers(capsys):
    from bench.trajectory_speed import main

    main(["--profile", "tiny", "--prompts", "4", "--max-new-tokens", "16", "--batch-sizes", "2", "--repeats", "2",
          "--caches", "reserved", "concatenating", "--threads", "1"])  # fmt: skip
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| jacobi |", "| synthetic |"))]
    assert len(rows) == 4  # two kinds x two caches
    assert all(float(row.strip("|").split("|")[3]) > 0 for row in rows)  # measured tokens per second
    ratios = [line for line in out.splitlines() if "the reserved cache gives" in line]
    assert len(ratios) == 2 and all("(same answers)" in line for line in ratios)
