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
    save_decode_config(model_dir, JacobiConfig(block_size=32, max_new_tokens=64), extra={"tuned_on": 4})
    assert read_block(model_dir)["decode"]["block_size"] == 32
    assert load_decode_config(model_dir).block_size == 32
    assert json.loads((model_dir / "decode_tuning.json").read_text()) == {"tuned_on": 4}
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
