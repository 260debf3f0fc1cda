"""One stop value for every decoder: every EOS id and the pad id, checked once where it is made."""

from __future__ import annotations

import pickle

import pytest

from jf_core.decoding.common import StopTokens
from jf_core.models import stop_tokens
from jf_core.toy.tokenizer import build_tokenizer
from tests.conftest import TINY_MODELS


def test_eos_ids_in_any_form_become_one_set_and_a_missing_pad_is_refused_by_name():
    assert StopTokens(2, 0).eos == StopTokens([2], 0).eos == StopTokens((2, 2), 0).eos == frozenset({2})
    assert StopTokens(None, 0).eos == frozenset() and StopTokens((7, 3), 1) == StopTokens([3, 7], 1)
    with pytest.raises(ValueError, match="pad token id must be an int, got None"):
        StopTokens(2, None)
    stop = StopTokens((7, 3), 1)
    assert pickle.loads(pickle.dumps(stop)) == stop  # crosses to Ray actors and Serve replicas
    with pytest.raises(AttributeError):
        stop.pad = 2  # a value: nothing downstream can change it under a decoder


def test_a_models_stop_tokens_hold_its_tokenizers_and_its_generation_configs_eos():
    model, tok = TINY_MODELS["qwen2"](), build_tokenizer()
    model.generation_config.eos_token_id = [tok.eos_token_id, 5]
    stop = stop_tokens(model, tok)
    assert stop.eos == {tok.eos_token_id, 5} and stop.pad == tok.pad_token_id
