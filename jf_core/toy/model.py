"""The embedded default model: a small Qwen2, a real HF architecture, sized to train on 2 CPU cores in minutes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class ToyModelConfig:
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512

    def to_hf(self, vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen2Config:
        return Qwen2Config(
            vocab_size=vocab_size,
            tie_word_embeddings=True,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            bos_token_id=None,
            **asdict(self),
        )


def build_model(
    cfg: ToyModelConfig, vocab_size: int, pad_token_id: int, eos_token_id: int, seed: int
) -> Qwen2ForCausalLM:
    import torch

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg.to_hf(vocab_size, pad_token_id, eos_token_id))
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model
