"""What a model directory holds, and what of it is the model."""

from __future__ import annotations

import json

import pytest

from jf_core.decoding import JacobiConfig, load_decode_config
from jf_core.model_dir import (
    DONE,
    NOT_THE_MODEL,
    lineage,
    model_fingerprint,
    read_block,
    registry_copy,
    save_decode_config,
    update_block,
)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "tokenizer.json").write_text("{}")
    (d / DONE).write_text(json.dumps({"steps": 3}))
    (d / "decode_tuning.json").write_text("{}")
    (d / ".config.json.tmp").write_text("a half-written file")
    return d


def test_the_decode_config_lives_in_the_block_and_is_not_the_model(model_dir):
    before = model_fingerprint(model_dir)
    save_decode_config(model_dir, JacobiConfig(block_size=32, max_new_tokens=64))
    (model_dir / "decode_tuning.json").write_text(json.dumps({"tuned_on": 4}))  # the tune stage's marker
    assert read_block(model_dir)["decode"]["block_size"] == 32
    assert load_decode_config(model_dir).block_size == 32
    assert model_fingerprint(model_dir) == before  # how to decode it is not what it is
    (model_dir / "model.safetensors").write_bytes(b"other weights")
    assert model_fingerprint(model_dir) != before


def test_the_registry_copy_is_a_plain_checkpoint_with_its_decode_config(model_dir, tmp_path):
    update_block(model_dir, lineage=lineage("base/model"))
    copy = registry_copy(model_dir, tmp_path / "copy", fallback_decode={"block_size": 16})
    names = {p.name for p in copy.iterdir()}
    assert names == {"config.json", "model.safetensors", "tokenizer.json"}
    assert not names & NOT_THE_MODEL
    block = read_block(copy)
    assert block["decode"] == {"block_size": 16} and block["lineage"] == {"base": "base/model", "rounds": 1}
    assert read_block(model_dir).get("decode") is None  # the source is left as it was


def test_a_block_is_refused_outside_a_model_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        update_block(tmp_path, decode={"block_size": 16})


def test_a_decode_config_in_the_old_format_is_refused_naming_the_fix(model_dir):
    """Before the block held it, the decode config was a decode_config.json beside the weights: refused, not read."""
    (model_dir / "decode_config.json").write_text(json.dumps({"block_size": 32, "max_new_tokens": 64}))
    with pytest.raises(
        ValueError, match=r"decode_config.json: a decode config in the format of an older version.*jf tune"
    ):
        load_decode_config(model_dir)
    save_decode_config(model_dir, JacobiConfig(block_size=16, max_new_tokens=64))  # what `jf tune` does
    assert load_decode_config(model_dir).block_size == 16
