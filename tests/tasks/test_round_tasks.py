"""The progress line a long stage says in its run's log (terminal and Prefect UI)."""

from __future__ import annotations

from jacobi_forcing.tasks.round_tasks import progress_line


def test_the_estimate_is_the_pace_of_this_attempt_times_what_is_left():
    # 10 of 25 shards were committed by an earlier attempt; this one did 5 in 100 s: 10 left at 20 s each.
    assert progress_line("trajectory shards", 15, 25, 100.0, 5) == "trajectory shards: 15/25, 100 s, about 200 s left"


def test_no_estimate_before_any_pace_nor_at_the_end():
    assert progress_line("trajectory shards", 10, 25, 3.0, 0) == "trajectory shards: 10/25, 3 s"
    assert progress_line("trajectory shards", 25, 25, 500.0, 25) == "trajectory shards: 25/25, 500 s"


def test_a_training_says_about_twenty_lines_whatever_its_logging_cadence():
    """The bootstrap logs every 100 of its 2700 steps, the round's training every 10 of 3000: either way about
    twenty lines reach the run's log, and every TPF probe; the progress bar gets every logged step."""
    from jacobi_forcing.tasks.round_tasks import step_logger

    for steps, every in ((2700, 100), (3000, 10)):
        lines, bar = [], []
        on_log = step_logger("bootstrap: ", steps, lines.append, lambda done, total, bar=bar: bar.append((done, total)))
        for step in range(0, steps, every):
            on_log(step, {"step": step, "loss": 1.0})
        assert 14 <= len(lines) <= 21, (steps, len(lines))
        assert lines[0] == f"bootstrap: step 0/{steps}: loss 1" and len(bar) == steps // every
    lines = []
    on_log = step_logger("", 3000, lines.append)
    on_log(0, {"loss": 1.0})
    on_log(10, {"probe_tpf_n16": 2.5})
    assert lines[-1] == "step 10/3000: probe_tpf_n16 2.5"
