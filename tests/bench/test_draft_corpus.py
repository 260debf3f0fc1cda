"""bench/draft_corpus.py: a model directory whose draft corpus is the model's own greedy answers, loaded with it."""

from __future__ import annotations

import json

import pytest

from jf_core.decoding import ar_decode
from jf_core.decoding.proposers.suffix import SuffixIndex, draft_corpus
from jf_core.models import load_model, stop_tokens
from tests.jf_core.test_models import save_tiny


def test_the_corpus_is_the_models_greedy_answers_and_loads_with_the_model(tmp_path):
    from bench.draft_corpus import main

    base = tmp_path / "base"
    save_tiny(base)
    questions = ["2+3=", "7+1=", "4+4="]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in questions))
    out = tmp_path / "corpus"
    args = ["--model", str(base), "--prompts", str(tmp_path / "q.jsonl"), "--num-prompts", "2"]
    main([*args, "--max-new-tokens", "12", "--batch-size", "1", "--threads", "1", "--out", str(out)])
    model, tok = load_model(str(base))
    ids = [tok(q, add_special_tokens=False)["input_ids"] for q in questions[:2]]
    want = ar_decode(model, ids, max_new_tokens=12, stop=stop_tokens(model, tok)).sequences
    assert json.loads((out / "answers.json").read_text()) == want
    with_corpus, _ = load_model(str(out))
    assert draft_corpus(with_corpus).tokens.tolist() == SuffixIndex.of(want).tokens.tolist()
    assert (out / "model.safetensors").is_symlink() and not (out / "config.json").is_symlink()
    with pytest.raises(SystemExit):
        main([*args, "--out", str(out)])  # an existing directory is refused
