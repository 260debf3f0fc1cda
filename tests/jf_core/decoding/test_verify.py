from jf_core.decoding.verify import accepted_length


def test_first_token_is_always_accepted():
    assert accepted_length([7], [9]) == 1
    assert accepted_length([7, 1, 2], [5, 5, 5]) == 1


def test_longest_prefix_only():
    # greedy[i] is the prediction after window[: i + 1]; a later match after a mismatch does not count.
    assert accepted_length([7, 1, 2, 3], [1, 2, 9, 4]) == 3
    assert accepted_length([7, 1, 2, 3], [1, 9, 3, 4]) == 2
    assert accepted_length([7, 1, 2, 3], [1, 2, 3, 4]) == 4
