from __future__ import annotations

import gzip
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prompts import PromptSourceConfig, PromptSourceError, load_prompts, read_rows

CODE = "def f(x):\n    if x:\n        return 1\n\n    return 2\n"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def write_jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" if isinstance(r, dict) else r + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def test_jsonl_keeps_whitespace_and_counts_skips(tmp_path, tok):
    rows = [
        {"id": "code", "prompt": CODE},
        {"id": "missing", "question": "no prompt field"},
        {"id": "blank", "prompt": "  \n\t "},
        {"id": "long", "prompt": "a=1; " * 200},
        {"id": "short", "prompt": "a=1"},
    ]
    cfg = PromptSourceConfig(source=str(write_jsonl(tmp_path / "p.jsonl", rows)), id_field="id", max_prompt_tokens=100)
    got = load_prompts(cfg, tok)
    assert [i.prompt_id for i in got.items] == ["short", "code"]  # sorted by length
    assert tok.decode(got.items[1].token_ids) == CODE  # indentation and blank lines survive
    assert got.skipped == {"missing_field:prompt": 1, "empty": 1, "too_long": 1}


def test_context_length_counts_generation_budget(tmp_path, tok):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a=1; step +2; return f"}])
    cfg = PromptSourceConfig(source=str(path))
    assert len(load_prompts(cfg, tok, context_length=64, max_new_tokens=32).items) == 1
    assert load_prompts(cfg, tok, context_length=64, max_new_tokens=60).skipped == {"too_long": 1}


def test_malformed_line_names_file_and_line(tmp_path, tok):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, '{"prompt": "broken'])
    with pytest.raises(PromptSourceError, match=r"bad\.jsonl:2: not valid JSON"):
        load_prompts(PromptSourceConfig(source=str(path)), tok)


def test_gz_parquet_and_datasets_dir(tmp_path, tok):
    import datasets

    rows = [{"prompt": f"program: a={i}; step +1; return f"} for i in range(5)]
    gz = write_jsonl(tmp_path / "p.jsonl.gz", rows, gz=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    results = [
        load_prompts(PromptSourceConfig(source=str(src)), tok).items
        for src in (gz, tmp_path / "p.parquet", tmp_path / "ds")
    ]
    assert results[0] == results[1] == results[2] and len(results[0]) == 5


def test_missing_file_is_named(tmp_path, tok):
    with pytest.raises(PromptSourceError, match="does not exist"):
        load_prompts(PromptSourceConfig(source=str(tmp_path / "nope.jsonl")), tok)


def test_chat_template_applied_to_text_and_messages(tmp_path, tok):
    templated = build_tokenizer()
    templated.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    rows = [{"prompt": "a=1", "messages": [{"role": "user", "content": "a=1"}]}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    by_text = load_prompts(PromptSourceConfig(source=str(path)), templated).items[0]
    by_messages = load_prompts(PromptSourceConfig(source=str(path), messages_field="messages"), templated).items[0]
    assert templated.decode(by_text.token_ids) == "<user>a=1\n<assistant>"
    assert by_text.token_ids == by_messages.token_ids
    plain = load_prompts(PromptSourceConfig(source=str(path), chat_template=False), templated).items[0]
    assert templated.decode(plain.token_ids) == "a=1"
    untemplated = build_tokenizer()
    untemplated.chat_template = None
    with pytest.raises(PromptSourceError, match="chat template"):
        load_prompts(PromptSourceConfig(source=str(path), messages_field="messages"), untemplated)


def test_embedded_source_and_unique_ids(tmp_path, tok):
    items = load_prompts(PromptSourceConfig(source="embedded", limit=20), tok).items
    assert len(items) == 20 and len({i.prompt_id for i in items}) == 20
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}])
    with pytest.raises(PromptSourceError, match="not unique"):
        load_prompts(PromptSourceConfig(source=str(path), id_field="id"), tok)


FIXTURE = __import__("pathlib").Path(__file__).parents[2] / "fixtures" / "word_problems.jsonl"
SPLITS = {"train": 0.6, "calib": 0.1, "test": 0.3}


def _split(tok, split: str, source=FIXTURE) -> set[str]:
    cfg = PromptSourceConfig(source=str(source), text_field="question", hash_splits=SPLITS, split=split)
    return {tok.decode(p.token_ids) for p in load_prompts(cfg, tok).items}


def test_hash_splits_partition_a_file_by_its_text_whatever_the_order(tmp_path, tok):
    """A file with no splits (GSM8K's test set) becomes train / calib / test by a hash of each question: disjoint,
    together the whole file, and the same split for the same text when the file is shuffled."""
    splits = {name: _split(tok, name) for name in SPLITS}
    questions = {json.loads(line)["question"] for line in FIXTURE.open()}
    assert all(splits.values()), splits  # every split has rows on this fixture (40 questions)
    assert set.union(*splits.values()) == questions
    assert sum(map(len, splits.values())) == len(questions)
    shuffled = tmp_path / "shuffled.jsonl"
    lines = FIXTURE.read_text().splitlines()
    shuffled.write_text("\n".join(reversed(lines)) + "\n")
    assert {name: _split(tok, name, shuffled) for name in SPLITS} == splits


def test_hash_splits_are_checked(tok):
    with pytest.raises(ValueError, match="hash_splits must be positive fractions summing to 1"):
        PromptSourceConfig(source=str(FIXTURE), hash_splits={"train": 0.7, "test": 0.2})
    cfg = PromptSourceConfig(source=str(FIXTURE), text_field="question", hash_splits=SPLITS, split="validation")
    with pytest.raises(PromptSourceError, match="split 'validation' is not one of hash_splits"):
        load_prompts(cfg, tok)


def test_the_evaluation_holds_out_its_hash_split_of_the_prompt_file(tok):
    """evaluation.split scores the benchmark rows of the prompt file in that split, and no others: none of them is
    a training or calibration prompt."""
    from jf_core.config import load_profile
    from jf_core.evaluation.evaluate import eval_set
    from jf_core.evaluation.evaluate import held_out as held_out_filter
    from jf_core.trajectory.prompts import PromptFormat, held_out_source

    profile = load_profile(
        "smollm2-135m",
        prompts={"source": str(FIXTURE), "hash_splits": SPLITS, "chat_template": False, "limit": None},
        evaluation={"num_prompts": 100},
    )
    assert profile.evaluation.source == str(FIXTURE)  # defaults to the prompt file
    fmt = PromptFormat(chat_template=False)
    halves = {part: eval_set(profile.evaluation, tok, fmt, part=part) for part in ("development", "confirmation")}
    questions = {part: {item.record["question"] for item in held.items} for part, held in halves.items()}
    # The test split in two fixed halves: decisions read one, reported figures the other.
    assert questions["development"] | questions["confirmation"] == _split(tok, "test")
    assert questions["development"] and questions["confirmation"]
    assert not questions["development"] & questions["confirmation"]
    assert not _split(tok, "test") & (_split(tok, "train") | _split(tok, "calib"))
    # The same halves whichever way the held-out questions are read: as benchmark rows or as prompts.
    as_prompts = held_out_source(profile.prompts, None, "test", "confirmation").model_copy(update={"limit": None})
    assert {tok.decode(p.token_ids) for p in load_prompts(as_prompts, tok).items} == questions["confirmation"]
    # GSM8K's test file beside its train file: every row of it is held out, not only its "test" hash split.
    other = load_profile("smollm2-135m", prompts={"source": str(FIXTURE)}, evaluation={"source": "test.jsonl"})
    assert other.evaluation.split == "test" and held_out_filter(other.evaluation) is None
    with pytest.raises(ValueError, match="is the training split"):
        load_profile("smollm2-135m", evaluation={"split": "train"})
    with pytest.raises(ValueError, match=r"needs prompts\.hash_splits naming it"):
        load_profile("smollm2-135m", evaluation={"split": "holdout"})


def test_number_variants_rewrite_each_number_consistently_and_reproducibly():
    import random

    from jf_core.trajectory.prompts import number_variant

    text = "Ana has 23 apples and buys 4 packs of 23 apples at $1.05 each in 2019."
    a, b = number_variant(text, random.Random("s")), number_variant(text, random.Random("s"))
    assert a == b  # seeded
    assert re.sub(r"\d", "#", a) == re.sub(r"\d", "#", text)  # every number keeps its digits, the words stay
    first, *_ = re.findall(r"\d+", a)
    assert re.findall(r"\d+", a)[2] == first  # 23 is replaced the same way both times it appears
    assert ".05" in a  # a run with a leading zero stays
    assert a != text


def test_number_variants_grow_the_train_split_only_and_inherit_their_source_split(tok):
    """More training questions of the same kind; the held-out split gets none, and no variant of a held-out
    question is trained on."""
    base = PromptSourceConfig(source=str(FIXTURE), text_field="question", hash_splits=SPLITS, split="train")
    grown = base.model_copy(update={"number_variants": 3})
    plain_ids = [i for i, _ in read_rows(base)]
    rows = list(read_rows(grown))
    assert len(rows) == 4 * len(plain_ids)
    originals = {i: r for i, r in read_rows(base)}
    for row_id, row in rows:
        if "~" in row_id:
            source = originals[row["variant_of"]]
            assert row_id.split("~")[0] == row["variant_of"] and row["question"] != source["question"]
            assert re.sub(r"\d", "#", row["question"]) == re.sub(r"\d", "#", source["question"])
    assert list(read_rows(grown)) == rows  # the same variants on every read
    test = base.model_copy(update={"split": "test"})
    assert list(read_rows(test.model_copy(update={"number_variants": 3}))) == list(read_rows(test))
    items = load_prompts(grown, tok).items
    assert len({i.prompt_id for i in items}) == len(items) == len(rows)
    assert base.identity() == PromptSourceConfig(**base.model_dump(exclude={"number_variants"})).identity()
    assert "number_variants" not in base.identity() and grown.identity()["number_variants"] == 3
    with pytest.raises(ValueError, match="number_variants rewrites a text field"):
        PromptSourceConfig(source=str(FIXTURE), messages_field="messages", number_variants=2)


def test_held_out_questions_come_from_the_evaluation_file_where_it_names_another():
    """GSM8K's train split trained on, its test split held out: the evaluation's file read whole (no hash split,
    no number variants); with no other file, the prompt file's held-out hash split."""
    from jf_core.trajectory.prompts import held_out_source

    prompts = PromptSourceConfig(source="train.jsonl", hash_splits={"train": 0.8, "test": 0.2}, number_variants=2)
    held = held_out_source(prompts, "test.jsonl", None, "confirmation")
    assert held.source == "test.jsonl" and held.hash_splits is None and held.number_variants == 0
    assert held.held_out_slice == "confirmation" and "held_out_slice" not in prompts.identity()
    same = held_out_source(prompts, None, None, "development")
    assert same.source == "train.jsonl" and same.split == "test" and same.hash_splits == prompts.hash_splits
    assert same.held_out_slice == "development"
    assert held_out_source(prompts, "train.jsonl", "calib", "development").split == "calib"
    # The embedded task's halves are its own disjoint splits.
    toy = PromptSourceConfig(source="embedded")
    assert held_out_source(toy, None, None, "development").split == "calib"
    assert held_out_source(toy, None, None, "confirmation").split == "test"
