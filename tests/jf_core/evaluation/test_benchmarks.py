"""Benchmark loaders (JSONL, JSONL.gz, Parquet; clear errors) and scorers, on small fixtures written here."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.evaluation.benchmarks import BenchmarkError, accuracy, load_benchmark, score

HUMANEVAL = [
    {
        "task_id": "T/0",
        "prompt": 'def add(a, b):\n    """Add two numbers."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
    },
    {
        "task_id": "T/1",
        "prompt": "def rev(s):\n",
        "canonical_solution": "    return s[::-1]\n",
        "test": "def check(candidate):\n    assert candidate('ab') == 'ba'\n",
        "entry_point": "rev",
    },
]


@pytest.fixture()
def humaneval_gz(tmp_path):
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in HUMANEVAL)
    return str(path)


def test_humaneval_canonical_passes_and_prompt_alone_fails(humaneval_gz):
    items = load_benchmark("humaneval", humaneval_gz)
    assert [i.uid for i in items] == ["T/0", "T/1"] and items[0].prompt == HUMANEVAL[0]["prompt"]
    assert accuracy("humaneval", items, [r["canonical_solution"] for r in HUMANEVAL]) == 1.0
    assert accuracy("humaneval", items, ["", ""]) == 0.0
    chat = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert score("humaneval", items[0], chat)


def test_mbpp_from_parquet(tmp_path):
    rows = [
        {
            "task_id": 7,
            "text": "Square a number.",
            "code": "def sq(x):\n    return x * x",
            "test_list": ["assert sq(3) == 9", "assert sq(-2) == 4"],
            "test_setup_code": "",
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mbpp.parquet")
    items = load_benchmark("mbpp", str(tmp_path / "mbpp.parquet"))
    assert "assert sq(3) == 9" in items[0].prompt
    assert score("mbpp", items[0], rows[0]["code"]) and not score("mbpp", items[0], "def sq(x):\n    return x")


def test_gsm8k_and_math_from_jsonl(tmp_path):
    (tmp_path / "g.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1+1=<<1+1=2>>2\n#### 2"}) + "\n")
    item = load_benchmark("gsm8k", str(tmp_path / "g.jsonl"))[0]
    assert item.prompt == "Question: 1+1?\nAnswer:" and score("gsm8k", item, "The answer is 2.")
    (tmp_path / "m.jsonl").write_text(json.dumps({"problem": "Half?", "solution": r"It is $\boxed{\frac12}$."}) + "\n")
    item = load_benchmark("math", str(tmp_path / "m.jsonl"), template="Q: {problem}\nA:")
    assert item[0].prompt == "Q: Half?\nA:" and score("math", item[0], r"\boxed{0.5}")


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_benchmark("gsm8k", str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(BenchmarkError, match="row 0 lacks field"):
        load_benchmark("gsm8k", str(tmp_path / "bad.jsonl"))
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(BenchmarkError, match=r"broken\.jsonl:1"):
        load_benchmark("gsm8k", str(tmp_path / "broken.jsonl"))
    with pytest.raises(BenchmarkError, match="unknown benchmark"):
        load_benchmark("nope")


def test_embedded_items_score_exact_match():
    item = load_benchmark("embedded", limit=3)[0]
    assert score("embedded", item, item.record["answer"]) and not score("embedded", item, "answer 0")


def test_humaneval_keeps_the_prompts_imports_and_helpers_when_the_completion_redefines_the_function(tmp_path):
    """A chat model writes the whole function; the prompt's imports and earlier helpers must stay in the program."""
    record = {
        "task_id": "T/2",
        "prompt": "from typing import List\nimport math\n\n\ndef norm(v: List[float]) -> float:\n"
        "    return math.sqrt(sum(x * x for x in v))\n\n\ndef unit(v: List[float]) -> List[float]:\n"
        '    """Scale v to length 1."""\n',
        "test": "def check(candidate):\n    assert candidate([3.0, 4.0]) == [0.6, 0.8]\n",
        "entry_point": "unit",
    }
    (tmp_path / "he.jsonl").write_text(json.dumps(record) + "\n")
    item = load_benchmark("humaneval", str(tmp_path / "he.jsonl"))[0]
    whole = "```python\ndef unit(v: List[float]) -> List[float]:\n    n = norm(v)\n    return [x / n for x in v]\n```"
    assert score("humaneval", item, whole)  # List, math and norm all come from the prompt
    assert score("humaneval", item, "    n = norm(v)\n    return [x / n for x in v]\n")  # a plain continuation
    assert not score("humaneval", item, "```python\ndef unit(v):\n    return v\n```")


def test_math_500_from_a_local_file(tmp_path):
    rows = [
        {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "answer": "2", "unique_id": "a/1.json"},
        {"problem": "Half of one?", "solution": "...", "answer": "\\frac{1}{2}", "unique_id": "a/2.json"},
    ]
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = load_benchmark("math", str(path))
    assert [i.prompt.startswith("Problem: ") for i in items] == [True, True]
    assert accuracy("math", items, ["so \\boxed{2}", "\\boxed{0.5}"]) == 1.0
    assert accuracy("math", items, ["\\boxed{3}", "no box"]) == 0.0
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "x"}) + "\n")
    with pytest.raises(BenchmarkError, match="answer or solution"):
        load_benchmark("math", str(tmp_path / "bad.jsonl"))
