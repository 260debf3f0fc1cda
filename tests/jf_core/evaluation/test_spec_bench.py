"""Spec-Bench (jf_core/evaluation/spec_bench.py, `jf bench spec`): questions by group in the file's order, every turn
a prompt (a later turn after the model's own answer), every method taking turns per group, every output AR's."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from jf_core.evaluation.spec_bench import Question, load_questions, turn_prompts
from jf_core.trajectory.prompts import PromptFormat

ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["a=1; b=", "and c="]},
    {"question_id": 2, "category": "coding", "turns": ["x=2; y="]},
    {"question_id": 3, "category": "translation", "turns": ["p=3; q="]},
    {"question_id": 4, "category": "translation", "turns": ["r=4; s="]},
    {"question_id": 5, "category": "qa", "turns": ["t=5; u="]},
]


def _file(tmp_path, rows=ROWS):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_questions_come_by_group_in_the_files_order(tmp_path):
    got = load_questions(_file(tmp_path), per_group=1, groups=["mt_bench", "translation", "rag"])
    assert [q.question_id for q in got["mt_bench"]] == [1]  # MT-bench's eight categories are one group
    assert [q.question_id for q in got["translation"]] == [3] and got["rag"] == []
    assert "qa" not in got
    assert [q.question_id for q in load_questions(_file(tmp_path), per_group=5)["mt_bench"]] == [1, 2]


def test_a_malformed_question_or_group_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"question.jsonl:2: not a Spec-Bench question \(KeyError"):
        load_questions(_file(tmp_path, [ROWS[0], {"question_id": 9, "turns": ["x"]}]), per_group=1)
    with pytest.raises(ValueError, match=r"question\.jsonl:1: turns must be non-empty strings"):
        load_questions(_file(tmp_path, [{"question_id": 9, "category": "qa", "turns": []}]), per_group=1)
    with pytest.raises(ValueError, match=r"groups \['chat'\] unknown"):
        load_questions(_file(tmp_path), per_group=1, groups=["chat"])
    with pytest.raises(ValueError, match="does not exist"):
        load_questions(tmp_path / "none.jsonl", per_group=1)


def test_a_second_turn_follows_the_models_own_answer_in_its_chat_template(embedded):
    _, tok = embedded
    answers = []

    def answer(ids):
        answers.append(ids)
        return tok("42", add_special_tokens=False)["input_ids"]

    q = Question(1, "writing", ("a=1; b=", "and c="))
    plain = turn_prompts([q], tok, answer, PromptFormat(chat_template=False))
    assert len(plain) == 2 and answers == [plain[0]]  # asked once, for the first turn
    assert tok.decode(plain[1]) == tok.decode(plain[0]) + "42" + "\n\nand c="
    chat_tok = copy.deepcopy(tok)
    chat_tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    chat = turn_prompts([q], chat_tok, answer, PromptFormat())
    assert chat_tok.decode(chat[1]).endswith("<user>a=1; b=<assistant>42<user>and c=<assistant>")


def test_bench_spec_times_every_method_per_group_and_checks_every_output(profile, tmp_path, capsys):
    from jf_cli.main import main

    data = profile.model_dump(mode="json")
    data["evaluation"].update(max_new_tokens=8)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "spec"
    argv = ["bench", "spec", "--profile", str(path), "--source", str(_file(tmp_path)), "--per-group", "2"]
    argv += ["--groups", "mt_bench", "translation", "--no-tune", "--block-size", "4", "--out", str(out)]
    # A "trained" model of the same base: the profile's own weights, so its rows must give the base's AR text.
    assert main([*argv, "--jf-model", profile.model.path]) == 0
    result = json.loads((out / "spec_bench.json").read_text())
    assert list(result["groups"]) == ["mt_bench", "translation"]
    mt = result["groups"]["mt_bench"]
    assert set(mt) == {"hf_prompt_lookup", "ar", "ar_control", "lookup_n4", "jf_jacobi_n16"}  # no stored config: n = 16
    assert result["meta"]["jf_model"] == profile.model.path and result["meta"]["untrained_tuned"] is None
    assert all(row["identical_fraction"] == 1.0 for g in result["groups"].values() for row in g.values())
    assert "| mt_bench | 3 |" in capsys.readouterr().out  # two questions, one of them two turns
