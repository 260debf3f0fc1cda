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


def test_first_n_writes_the_smaller_corpora_from_the_same_decode(tmp_path, capsys):
    """`--first 1 2` beside 3 answers: OUT-1 and OUT-2 hold the first 1 and 2 of OUT's answers, each a model
    directory that loads; a size not below the questions the file holds is refused before anything is decoded or
    written."""
    from bench.draft_corpus import main

    base = tmp_path / "base"
    save_tiny(base)
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in ["2+3=", "7+1=", "4+4="]))
    args = ["--model", str(base), "--prompts", str(tmp_path / "q.jsonl"), "--num-prompts", "3", "--threads", "1"]
    with pytest.raises(SystemExit):
        main([*args, "--out", str(tmp_path / "c"), "--first", "3"])
    more = [*args[:-4], "--num-prompts", "8", "--threads", "1"]  # the file holds 3 of the 8 asked
    with pytest.raises(SystemExit):
        main([*more, "--out", str(tmp_path / "c"), "--first", "3"])
    assert "the 3 questions decoded from" in capsys.readouterr().err
    assert not list(tmp_path.glob("c*"))
    main([*args, "--max-new-tokens", "8", "--out", str(tmp_path / "c"), "--first", "1", "2"])
    every = json.loads((tmp_path / "c" / "answers.json").read_text())
    for n in (1, 2):
        assert json.loads((tmp_path / f"c-{n}" / "answers.json").read_text()) == every[:n]
        with_corpus, _ = load_model(str(tmp_path / f"c-{n}"))
        assert draft_corpus(with_corpus).tokens.tolist() == SuffixIndex.of(every[:n]).tokens.tolist()
