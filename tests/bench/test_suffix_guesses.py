"""bench/suffix_guesses.py: each rule scored on answers the corpus does not hold, by what its guesses get right and
what they lay out."""

from __future__ import annotations

import json

import pytest


def test_each_rule_counts_what_its_guesses_get_right_and_lay_out(tmp_path):
    from bench.suffix_guesses import main

    # The corpus's two answers go on 1, 2 -> 3, 4, 5, 6; the guessed one agrees for 3, 4 and then departs.
    answers = [[9, 1, 2, 3, 4, 5, 6], [8, 1, 2, 3, 4, 5, 6], [7, 1, 2, 3, 4, 40, 41]]
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    out = tmp_path / "rules.json"
    rules = ['long:{"share": 0.5, "factor": 0}', 'bounded:{"share": 0.5, "factor": 1.0}']
    args = ["--answers", str(tmp_path / "answers.json"), "--corpus", "2", "--json", str(out)]
    main([*args, *[a for rule in rules for a in ("--rule", rule)]])
    rows = json.loads(out.read_text())["rules"]
    # Positions 2-5 of the guessed answer (its text so far ending 1 / 2 / 3 / 4): the last three guess (the corpus
    # never holds [7, 1]).
    assert rows["long"]["positions"] == rows["bounded"]["positions"] == 4
    # Unbounded, after [.., 1, 2] the guess is 3, 4, 5, 6 (2 right of 4 laid out), after 3: 4, 5, 6 (1 of 3),
    # after 4: 5, 6 (0 of 2). Bounded by the tail matched (2, 3 and 4 tokens): 3, 4 / 4, 5, 6 / 5, 6.
    assert rows["long"]["right_per_position"] == rows["bounded"]["right_per_position"] == pytest.approx(3 / 4)
    assert rows["long"]["laid_per_position"] == pytest.approx(9 / 4)
    assert rows["bounded"]["laid_per_position"] == pytest.approx(7 / 4)
    with pytest.raises(SystemExit):
        main(["--answers", str(tmp_path / "answers.json"), "--corpus", "3", "--rule", rules[0]])
