from __future__ import annotations

import json

from transformers import AutoTokenizer, Qwen2Tokenizer

from jf_core.toy.task import make_split
from jf_core.toy.tokenizer import EOS, PAD, build_tokenizer


def test_is_a_qwen2_tokenizer_that_survives_autotokenizer(tmp_path):
    tok = build_tokenizer()
    assert isinstance(tok, Qwen2Tokenizer)
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert type(again) is Qwen2Tokenizer
    assert (again.eos_token, again.pad_token) == (EOS, PAD) and again.eos_token_id != again.pad_token_id
    for e in make_split("test", 50):
        text = e.prompt + " " + e.answer
        ids = again(text, add_special_tokens=False)["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
        assert again.decode(ids) == text


def test_deterministic():
    assert build_tokenizer().get_vocab() == build_tokenizer().get_vocab()
