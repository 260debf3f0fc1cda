from __future__ import annotations

import pytest

from jf_core.training.noise import NoiseSchedule, noise_ratio, pick_noisy_state


def test_progressive_rises_over_the_window_then_cycles():
    s = NoiseSchedule("progressive", window=5, min_ratio=0.0, max_ratio=1.0)
    assert [s.target(j) for j in range(7)] == [0.0, 0.25, 0.5, 0.75, 1.0, 0.0, 0.25]
    r = NoiseSchedule("reverse", window=5)
    assert [r.target(j) for j in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 1.0]


def test_progressive_phase_rises_like_progressive_from_a_seeded_level_per_answer():
    s = NoiseSchedule("progressive_phase", window=5, seed=3)
    levels = s.levels()
    for pid in ("a", "b", "c"):
        start = levels.index(s.target(0, pid))
        assert [s.target(j, pid) for j in range(7)] == [levels[(start + j) % 5] for j in range(7)]
        assert [s.target(j, pid) for j in range(7)] == [s.target(j, pid) for j in range(7)]  # seeded
    # Over many answers block 0 meets every level, where plain progressive always gives it the cleanest one.
    assert {s.target(0, f"p{i}") for i in range(200)} == set(levels)
    assert {NoiseSchedule("progressive", window=5).target(0, f"p{i}") for i in range(200)} == {0.0}
    other = NoiseSchedule("progressive_phase", window=5, seed=4)
    assert [s.target(0, f"p{i}") for i in range(50)] != [other.target(0, f"p{i}") for i in range(50)]


def test_random_is_seeded_and_uses_the_levels():
    a = NoiseSchedule("random", window=4, seed=1)
    assert [a.target(j, "p") for j in range(20)] == [a.target(j, "p") for j in range(20)]
    assert {a.target(j, "p") for j in range(50)} <= set(a.levels())
    b = NoiseSchedule("random", window=4, seed=2)
    assert [a.target(j, "p") for j in range(20)] != [b.target(j, "p") for j in range(20)]


def test_noise_ratio_counts_from_the_first_unconverged_position():
    fixed = [1, 2, 3, 4]
    assert noise_ratio([1, 2, 3, 4], fixed, 4) == 0.0
    assert noise_ratio([1, 2, 9, 4], fixed, 4) == 0.5
    assert noise_ratio([9, 2, 3, 4], fixed, 4) == 1.0
    assert noise_ratio([1, 2, 9, 9], fixed, 2) == 0.0  # only the valid length (through EOS) counts


def test_pick_closest_state_ties_to_the_earliest():
    fixed = [1, 2, 3, 4]
    states = [[1, 9, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9], fixed]  # ratios .75 .5 .25 0
    assert pick_noisy_state(states, fixed, 4, 0.5) == 1
    assert pick_noisy_state(states, fixed, 4, 0.375) == 1  # equidistant from .5 and .25: the earlier
    assert pick_noisy_state(states, fixed, 4, 0.0) == 3


def test_bad_schedules_are_named():
    with pytest.raises(ValueError, match="window"):
        NoiseSchedule(window=0)
    with pytest.raises(ValueError, match="min_ratio"):
        NoiseSchedule(min_ratio=0.8, max_ratio=0.2)


def _records(blocks_per_answer: dict[str, int]) -> list[dict]:
    fixed = [1, 2, 3, 4]
    states = [[9, 9, 9, 9], [1, 9, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9], fixed]  # ratios 1, .75, .5, .25, 0
    return [
        {"prompt_id": pid, "block_index": j, "states": states, "fixed_point": fixed, "length": 4}
        for pid, blocks in blocks_per_answer.items()
        for j in range(blocks)
    ]


def test_ratio_profile_shows_a_long_progressive_window_never_reaching_its_noisy_half_on_short_answers():
    """Answers of 4 blocks: a 16-level progressive window only uses its first 4 levels (targets 0 .. 0.2); the
    random pick over the same levels, and a window of 4, span the whole range."""
    from jf_core.training.noise import ratio_profile

    records = _records({f"p{i}": 4 for i in range(50)})
    long = ratio_profile(records, NoiseSchedule("progressive", window=16))
    assert long.blocks_per_answer.model_dump() == {"mean": 4.0, "p10": 4, "p50": 4, "p90": 4}
    assert long.target_mean == pytest.approx((0 + 1 + 2 + 3) / 15 / 4)
    assert long.picked_above_half == 0.0 and long.picked_histogram[0] == 100  # ratios 0 and .25
    matched = ratio_profile(records, NoiseSchedule("progressive", window=4))
    assert matched.picked_mean == pytest.approx((0 + 0.25 + 0.75 + 1) / 4)  # levels 0, 1/3, 2/3, 1
    phased = ratio_profile(records, NoiseSchedule("progressive_phase", window=16))
    assert 0.35 < phased.picked_mean < 0.65 and phased.picked_above_half > 0.3  # every level, like random
    rand = ratio_profile(records, NoiseSchedule("random", window=16))
    assert 0.35 < rand.picked_mean < 0.65 and rand.picked_above_half > 0.3
    cllm = ratio_profile(records, NoiseSchedule("uniform_state"))
    assert cllm.target_mean is None and cllm.picked_mean == pytest.approx(0.625, abs=0.08)  # 1 .75 .5 .25


def test_the_uniform_state_schedule_has_no_target():
    with pytest.raises(ValueError, match="no target ratio"):
        NoiseSchedule("uniform_state").target(0)
