"""`prepare_for_decoding` (jf_core/layers/prepare.py): the one step from a loaded model to one ready to decode, its
parameters, ties and state dict unchanged, its logits the unprepared model's."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from jf_core.layers import packed, prepare_for_decoding
from jf_core.layers.heads import Fp32LMHead, SlicedLMHead
from jf_core.layers.packed import PackedLinear


def _qwen2(tie: bool = True) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=3000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.skipif(not packed.AVAILABLE, reason="oneDNN's packed ops are pinned to another torch here")
def test_a_prepared_cpu_model_decodes_on_packed_layers_with_the_same_weights_and_logits(monkeypatch):
    plain, model = _qwen2(), _qwen2()
    keys = set(model.state_dict())
    monkeypatch.setattr(packed, "MIN_PACKED_BYTES", 0)  # as a model whose weights stream from memory
    prepared = prepare_for_decoding(model, torch.device("cpu"))
    assert prepared is model and not model.training
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 2 * 7  # q k v o gate up down per layer
    head = model.get_output_embeddings()
    assert isinstance(head, SlicedLMHead) and head.packed_weight is not None
    assert head.weight is model.get_input_embeddings().weight  # still tied
    assert set(model.state_dict()) == keys  # a checkpoint of the prepared model is the model's
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_a_small_model_stays_on_mkl_and_a_low_precision_one_gets_an_fp32_head():
    model = prepare_for_decoding(_qwen2(tie=False), torch.device("cpu"))
    assert not any(isinstance(m, PackedLinear) for m in model.modules())  # 3 MB of weights: cached, MKL is faster
    assert model.get_output_embeddings().packed_weight is None
    low = prepare_for_decoding(_qwen2(tie=False).to(torch.bfloat16), torch.device("cpu"), lm_head_fp32=True)
    head = low.get_output_embeddings()
    assert isinstance(head, Fp32LMHead) and head.weight.dtype == torch.float32
    with torch.no_grad():
        assert low(input_ids=torch.tensor([[5, 6, 7]])).logits.dtype == torch.float32
