"""Lossless on the embedded default: a trained model whose answers end with EOS somewhere inside a block."""

from __future__ import annotations

import pytest
import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.toy.task import make_split

MAX_NEW = 160

# The first test here may bootstrap the embedded model (about 8.5 minutes on 2 cores) inside its fixture.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def setup(embedded):
    model, tok = embedded
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 8)]
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )[0, len(p) :].tolist()
        expected.append(out)
    assert all(e[-1] == tok.eos_token_id for e in expected), "the embedded model should finish its answers"
    return model, tok, prompts, expected


@pytest.mark.parametrize("block_size", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("batch", [1, 4])
def test_jacobi_equals_generate_on_embedded_model(setup, block_size, batch):
    model, tok, prompts, expected = setup
    cfg = JacobiConfig(block_size=block_size, max_new_tokens=MAX_NEW)
    got = []
    for start in range(0, len(prompts), batch):
        got += jacobi_decode(
            model, prompts[start : start + batch], cfg, stop=StopTokens(tok.eos_token_id, tok.pad_token_id)
        ).sequences
    assert got == expected


def test_ar_equals_generate_on_embedded_model(setup):
    model, tok, prompts, expected = setup
    out = ar_decode(model, prompts, max_new_tokens=MAX_NEW, stop=StopTokens(tok.eos_token_id, tok.pad_token_id))
    assert out.sequences == expected
