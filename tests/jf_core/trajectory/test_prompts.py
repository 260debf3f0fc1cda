from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prompts import PromptSourceConfig, PromptSourceError, load_prompts

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
    with pytest.raises(PromptSourceError, match="chat template"):
        load_prompts(PromptSourceConfig(source=str(path), messages_field="messages"), tok)


def test_embedded_source_and_unique_ids(tmp_path, tok):
    items = load_prompts(PromptSourceConfig(source="embedded", limit=20), tok).items
    assert len(items) == 20 and len({i.prompt_id for i in items}) == 20
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}])
    with pytest.raises(PromptSourceError, match="not unique"):
        load_prompts(PromptSourceConfig(source=str(path), id_field="id"), tok)
