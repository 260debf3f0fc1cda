"""The progress line a long stage says in its run's log (terminal and Prefect UI)."""

from __future__ import annotations

from jacobi_forcing.tasks.round_tasks import progress_line


def test_the_estimate_is_the_pace_of_this_attempt_times_what_is_left():
    # 10 of 25 shards were committed by an earlier attempt; this one did 5 in 100 s: 10 left at 20 s each.
    assert progress_line("trajectory shards", 15, 25, 100.0, 5) == "trajectory shards: 15/25, 100 s, about 200 s left"


def test_no_estimate_before_any_pace_nor_at_the_end():
    assert progress_line("trajectory shards", 10, 25, 3.0, 0) == "trajectory shards: 10/25, 3 s"
    assert progress_line("trajectory shards", 25, 25, 500.0, 25) == "trajectory shards: 25/25, 500 s"
