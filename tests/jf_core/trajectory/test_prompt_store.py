"""Added prompt files: validated before anything is stored, stored once per content under a temporary name, and
merged after a profile's source by `prompts.extra_sources` (read whole, ids prefixed with the file's name)."""

from __future__ import annotations

import json

import pytest

from jf_core.toy.tokenizer import build_tokenizer
from jf_core.trajectory.prompt_store import add_prompt_file
from jf_core.trajectory.prompts import PromptSourceConfig, PromptSourceError, load_prompts


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_file_is_stored_once_per_content(tmp_path):
    src = jsonl(tmp_path / "new.jsonl", [{"prompt": "program: a=1; return a"}, {"prompt": "  "}, {"other": 1}])
    first = add_prompt_file(src, "tiny", PromptSourceConfig(), home=tmp_path / "home")
    again = add_prompt_file(src, "tiny", PromptSourceConfig(), home=tmp_path / "home")
    assert first.new and not again.new and first.uri == again.uri and first.rows == 1
    stored = list((tmp_path / "home" / "prompts" / "added" / "tiny").iterdir())
    assert [p.name for p in stored] == [f"{first.sha256[:12]}-new.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("none.jsonl", None, "prompt file .*none.jsonl does not exist"),
        ("p.txt", "hello\n", "p.txt: expected .jsonl, .jsonl.gz or .parquet"),
        ("bad.jsonl", "{not json\n", "bad.jsonl:1: not valid JSON"),
        ("empty.jsonl", json.dumps({"text": "x"}) + "\n", "empty.jsonl: no row has a non-empty 'prompt' field"),
    ],
)
def test_a_bad_file_is_refused_naming_it_and_nothing_is_stored(tmp_path, name, content, message):
    src = tmp_path / name
    if content is not None:
        src.write_text(content)
    with pytest.raises(PromptSourceError, match=message):
        add_prompt_file(src, "tiny", PromptSourceConfig(), home=tmp_path / "home")
    assert not (tmp_path / "home" / "prompts").exists()


def test_a_bad_collection_name_is_refused(tmp_path):
    src = jsonl(tmp_path / "new.jsonl", [{"prompt": "program: a=1; return a"}])
    with pytest.raises(PromptSourceError, match=r"collection '\.\./x'"):
        add_prompt_file(src, "../x", PromptSourceConfig(), home=tmp_path / "home")


def test_extra_sources_are_merged_whole_after_the_limited_source(tmp_path):
    tok = build_tokenizer()
    extra = jsonl(tmp_path / "added.jsonl", [{"prompt": f"program: a={i}; return a"} for i in range(3)])
    base = PromptSourceConfig(source="embedded", limit=5)
    merged = load_prompts(base.model_copy(update={"extra_sources": [str(extra)]}), tok)
    alone = load_prompts(base, tok)
    assert len(alone.items) == 5 and len(merged.items) == 8  # `limit` bounds the source, not the added file
    added = sorted(i.prompt_id for i in merged.items if i.prompt_id.startswith("added.jsonl/"))
    assert added == ["added.jsonl/0", "added.jsonl/1", "added.jsonl/2"]
