from __future__ import annotations

import json

import pytest
from jinja2.exceptions import TemplateError
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


def test_its_chat_template_hands_the_model_the_users_program_and_survives_a_save(tmp_path):
    """A chat is answered as a completion of the last user message (a system prompt is no part of the task); an
    assistant message last (a prefill) is refused by name, not rendered into text the model never saw."""
    build_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = AutoTokenizer.from_pretrained(tmp_path)
    program = make_split("test", 1)[0].prompt
    chat = [{"role": "system", "content": "Trace it."}, {"role": "user", "content": program}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == program
    with pytest.raises(TemplateError, match="the last message must be the user's"):
        tok.apply_chat_template([*chat, {"role": "assistant", "content": "a="}], tokenize=False)
