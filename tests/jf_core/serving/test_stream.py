"""A request's streamed text: chunks concatenate to exactly the non-streamed completion, never carry half a
character, never send what a stop string will cut, and respect the budget and EOS."""

from __future__ import annotations

import pytest

from jf_core.serving.stream import REPLACEMENT, TextStream
from jf_core.toy.tokenizer import build_tokenizer

TOK = build_tokenizer()
TEXT = "a=é→✓ ok; b=2; c=3"


def stream_all(stream: TextStream, tokens: list[int], step: int = 1) -> list[str]:
    chunks = [stream.feed(tokens[i : i + step]) for i in range(0, len(tokens), step)]
    return [*chunks, stream.finish()]


@pytest.mark.parametrize("step", [1, 2, 5])
def test_chunks_never_split_a_character_and_join_to_the_text(step):
    ids = TOK(TEXT, add_special_tokens=False)["input_ids"]
    stream = TextStream(TOK, max_new_tokens=100)
    chunks = stream_all(stream, ids, step)
    assert "".join(chunks) == TEXT == stream.text and stream.finish_reason == "length"
    assert not any(REPLACEMENT in c for c in chunks)
    assert sum(1 for c in chunks if c) >= 3  # streamed, not held to the end


@pytest.mark.parametrize("stop", ["; c", "b=", "✓ o", "never"])
def test_a_stop_string_across_chunks_is_cut_and_never_sent(stop):
    ids = TOK(TEXT, add_special_tokens=False)["input_ids"]
    stream = TextStream(TOK, max_new_tokens=100, stop=(stop, "zzzz"))
    chunks = []
    for token in ids:
        chunks.append(stream.feed([token]))
        assert stop not in "".join(chunks)
        if stream.done:
            break
    chunks.append(stream.finish())
    want = TEXT[: TEXT.find(stop)] if stop in TEXT else TEXT
    assert "".join(chunks) == want == stream.text
    assert stream.finish_reason == ("stop" if stop in TEXT else "length")


def test_budget_and_eos_end_the_stream():
    ids = TOK(TEXT, add_special_tokens=False)["input_ids"]
    budget = TextStream(TOK, max_new_tokens=4)
    assert "".join(stream_all(budget, ids)) == TOK.decode(ids[:4]) and budget.finish_reason == "length"
    assert budget.tokens == ids[:4] and budget.feed(ids) == ""
    eos = TOK.eos_token_id
    ended = TextStream(TOK, max_new_tokens=100, eos=frozenset({eos}))
    assert "".join(stream_all(ended, [*ids[:3], eos, *ids[3:]])) == TOK.decode(ids[:3], skip_special_tokens=True)
    assert ended.finish_reason == "stop" and ended.tokens == [*ids[:3], eos]
