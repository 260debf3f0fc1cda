from __future__ import annotations

import json

import pytest
from transformers import T5Config, T5ForConditionalGeneration

from jf_core.models import ModelLoadError, load_model, pick_attention
from jf_core.toy.model import ToyModelConfig, build_model
from jf_core.toy.tokenizer import build_tokenizer


def save_tiny(path):
    tok = build_tokenizer()
    model = build_model(ToyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64), len(tok), 0, 1, 0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def test_loads_a_local_directory_with_sdpa_on_cpu(tmp_path):
    save_tiny(tmp_path)
    model, tok = load_model(str(tmp_path))
    assert model.config._attn_implementation == "sdpa"
    assert not model.training and tok.eos_token_id == 1


def test_a_cpu_model_with_weights_that_stream_from_memory_gets_packed_layers(tmp_path, monkeypatch):
    """`load_model` packs a CPU model's layers and its LM head (jf_core/layers/packed.py) once their weights pass
    MIN_PACKED_BYTES, and leaves a model small enough to stay cached on MKL."""
    import torch

    from jf_core.layers import packed
    from jf_core.layers.packed import PackedLinear

    save_tiny(tmp_path)
    small, _ = load_model(str(tmp_path))
    assert not any(isinstance(m, PackedLinear) for m in small.modules())
    assert small.get_output_embeddings().packed_weight is None
    monkeypatch.setattr(packed, "MIN_PACKED_BYTES", 0)  # as a model past the threshold
    model, _ = load_model(str(tmp_path))
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert any(isinstance(m, PackedLinear) for m in model.modules())
    assert model.get_output_embeddings().packed_weight is not None
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, small(input_ids=ids).logits)


def test_attention_choice():
    assert pick_attention("eager") == "eager"
    import torch

    assert pick_attention("auto", torch.device("cpu")) == "sdpa"


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_directory_without_config_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(str(tmp_path))


def test_non_causal_checkpoint_is_named(tmp_path):
    # An encoder-decoder: AutoModelForCausalLM has no class for it (BERT would not do: HF maps it to BertLMHeadModel).
    cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(cfg).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path))


def test_tokenizer_without_eos_is_named(tmp_path):
    save_tiny(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token"] = None
    cfg_path.write_text(json.dumps(cfg))
    special = tmp_path / "special_tokens_map.json"
    if special.exists():
        data = json.loads(special.read_text())
        data.pop("eos_token", None)
        special.write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="no eos token"):
        load_model(str(tmp_path))


def test_pickled_weights_are_refused(tmp_path):
    """A checkpoint whose weights are only a pickle (torch.load can run code) is refused, naming safetensors."""
    import torch
    from transformers import AutoModelForCausalLM

    save_tiny(tmp_path)
    model, _ = load_model(str(tmp_path))
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # transformers 5 only writes safetensors
    AutoModelForCausalLM.from_pretrained(tmp_path)  # transformers alone would unpickle it
    with pytest.raises(ModelLoadError, match="no safetensors weights"):
        load_model(str(tmp_path))


def test_recurrent_models_are_refused_at_load_by_name(tmp_path):
    """A model whose state cannot drop rejected drafts is refused when loaded, naming why."""
    from transformers import MambaConfig, MambaForCausalLM

    save_tiny(tmp_path)  # the tokenizer
    MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=1)).save_pretrained(
        tmp_path
    )
    with pytest.raises(ModelLoadError, match="recurrent state"):
        load_model(str(tmp_path))


def test_attention_choice_follows_what_the_model_class_supports(monkeypatch):
    import importlib.util

    import torch

    class FlashAndSdpa:
        _supports_flash_attn, _supports_sdpa = True, True

    class SdpaOnly:
        _supports_flash_attn, _supports_sdpa = False, True

    class EagerOnly:
        _supports_flash_attn, _supports_sdpa = False, False

    cuda = torch.device("cuda")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else real(name))
    assert pick_attention("auto", cuda, FlashAndSdpa) == "flash_attention_2"
    assert pick_attention("auto", cuda, SdpaOnly) == "sdpa"
    assert pick_attention("auto", cuda, EagerOnly) == "eager"
    assert pick_attention("auto", torch.device("cpu"), FlashAndSdpa) == "sdpa"


def test_one_device_rule_for_a_process_and_one_for_a_ray_worker():
    """`auto` is CUDA where a device is visible, else the CPU; a CUDA device that is not there is refused by name
    (this machine has none: the check runs where the GPU tests are skipped). A Ray worker runs on CUDA when Ray
    gives it GPUs, else on the model's device, `auto` meaning the CPU there."""
    import torch

    from jf_core.config import load_profile
    from jf_core.models import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match=r"model.device: 'cuda', but no CUDA device is visible"):
            resolve_device("cuda")
    tiny = load_profile("tiny")
    assert tiny.worker_device() == ("cpu" if tiny.model.device == "auto" else tiny.model.device)
    gpus = load_profile("tiny", compute={"gpus_per_worker": 1})
    assert gpus.worker_device() == "cuda"
