from __future__ import annotations

import re

import pytest

from jf_core.toy.task import ToyTaskConfig, example_of, make_split, score
from jf_core.toy.tokenizer import build_tokenizer


def test_splits_are_deterministic_and_disjoint():
    assert make_split("test", 50) == make_split("test", 50)
    train = {e.prompt for e in make_split("train", 20_000)}
    test = {e.prompt for e in make_split("test", 500)}
    calib = {e.prompt for e in make_split("calib", 200)}
    assert not train & test and not train & calib and not test & calib


def test_answers_are_correct_traces_of_40_to_150_tokens():
    tok = build_tokenizer()
    for e in make_split("test", 300):
        start, op, step, last = re.fullmatch(r"program: a=(\d+); step ([+-])(\d); return ([a-z])", e.prompt).groups()
        value, step = int(start), int(step)
        lines = e.answer.split("; ")
        assert lines[0] == f"a={value}"
        names = "abcdefghijklmnopqrstuvwxyz"
        for i, line in enumerate(lines[1:-1], start=1):
            value = value + step if op == "+" else value - step
            assert line == f"{names[i]}={names[i - 1]}{op}{step}={value}"
            assert value >= 0
        assert names[len(lines) - 2] == last
        assert lines[-1] == f"answer {value}" and e.final == value
        n_tokens = len(tok(e.answer)["input_ids"]) + 1  # + EOS
        assert 40 <= n_tokens <= 150


def test_score_is_exact_match():
    e = make_split("test", 1)[0]
    assert score(e.answer, e) and score(f" {e.answer} ", e)
    assert not score(e.answer[:-1], e)


def test_bad_config_and_split_are_named():
    with pytest.raises(ValueError, match="min_steps"):
        ToyTaskConfig(min_steps=9, max_steps=3)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        make_split("dev", 3)


def test_a_hand_written_prompt_is_recognised_exactly_when_the_task_makes_such_prompts():
    for e in make_split("test", 200) + make_split("train", 200):
        assert example_of(e.prompt).answer == e.answer
    assert example_of("program: a=84; step -7; return e") is None  # 5 variables: the task makes 6 to 14
    assert example_of("program: a=84; step -7; return f").final == 49
    for outside in (
        "program: a=3; return a",  # no step
        "program: a=3; step +2; step -1; return c",  # two steps
        "program: a=100; step +1; return f",  # start above 99
        "program: a=20; step -5; return f",  # 20 - 25 < 0
        "program: a=3; step +0; return f",  # a step of 0
    ):
        assert example_of(outside) is None, outside
