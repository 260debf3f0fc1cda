"""Tiny models of real architectures, built from config objects (no downloads), their random weights sharpened.

Sliding windows are 8 tokens, shorter than every test sequence (prompts of up to 11 tokens plus 30 new ones), so
the window is really in play: in the prompt, in the cache, and in each window of drafts.

Random weights accept about one token a forward, so a decoder's multi-token paths (accepting a run of drafts,
committing it to the cache, spawning and promoting blocks) would go untested: 7 of the 80 (architecture, decoder)
cases never accepted two tokens in one forward. Each model is therefore sharpened first (`sharpened`): 60 seeded
Adam steps on sequences that repeat a random pattern, which teach it to continue from its context, so drafts are
accepted several at a time while its text still depends on the prompt (both asserted in test_architectures.py).
"""

from __future__ import annotations

import functools

import torch
import transformers as T

from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.multiblock import JFDecodeConfig

VOCAB = 256
WINDOW = 8
PROMPTS = [[5, 17, 33, 9, 40, 41, 12, 99, 3, 7, 8], [10, 11, 12], [50, 60, 70, 80, 90, 100]]  # the first > WINDOW
NEW = 30
DECODERS = {
    "jacobi": JacobiConfig(block_size=5, max_new_tokens=NEW),
    "multiblock": JFDecodeConfig(block_size=4, num_blocks=3, pool_size=0, spawn_ratio=0.5, max_new_tokens=NEW),
    "recycling": JFDecodeConfig(
        block_size=4, num_blocks=2, pool_size=2, seed_drafts=True, spawn_ratio=0.5, max_new_tokens=NEW
    ),
    # Narrow windows and AR steps (random weights accept about one token a forward): runs cut mid-block.
    "adaptive": JFDecodeConfig(
        block_size=8,
        num_blocks=2,
        pool_size=2,
        max_new_tokens=NEW,
        adaptive_width=True,
        width_scale=1.0,
        width_margin=0,
        width_floor=2,
        ar_below=1.5,
    ),
}
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

CONFIGS: dict[str, tuple[type, dict]] = {
    "qwen2": (T.Qwen2Config, _COMMON),
    "qwen2-hybrid-window": (
        T.Qwen2Config,
        {**_COMMON, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": (T.Qwen3Config, {**_COMMON, "head_dim": 8}),
    "llama": (T.LlamaConfig, _COMMON),
    "mistral-window": (T.MistralConfig, {**_COMMON, "sliding_window": WINDOW}),
    "mixtral-window": (
        T.MixtralConfig,
        {**_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    ),
    "qwen2-moe": (
        T.Qwen2MoeConfig,
        {
            **_COMMON,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "phi3": (T.Phi3Config, {**_COMMON, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1}),
    "gemma": (T.GemmaConfig, {**_COMMON, "head_dim": 8}),
    "gemma2-window": (T.Gemma2Config, {**_COMMON, "head_dim": 8, "sliding_window": WINDOW}),
    "gemma3-window": (
        T.Gemma3TextConfig,
        {**_COMMON, "head_dim": 8, "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "gpt-oss-window": (
        T.GptOssConfig,
        {
            **_COMMON,
            "intermediate_size": 32,
            "head_dim": 8,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "sliding_window": WINDOW,
        },
    ),
    "gpt2": (T.GPT2Config, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256, eos_token_id=2)),
    "gpt-neox": (
        T.GPTNeoXConfig,
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
        ),
    ),
    "opt": (
        T.OPTConfig,
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=256,
            pad_token_id=1,
        ),
    ),
    "falcon": (
        T.FalconConfig,
        dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256),
    ),
    "stablelm": (T.StableLmConfig, _COMMON),
    "starcoder2-window": (T.Starcoder2Config, {**_COMMON, "sliding_window": WINDOW}),
    "olmo2": (T.Olmo2Config, {**_COMMON, "eos_token_id": 2, "pad_token_id": 1}),
    "granite": (T.GraniteConfig, _COMMON),
}


SHARPEN_STEPS = 60


def _construct(name: str, attn_implementation: str) -> torch.nn.Module:
    cls, kwargs = CONFIGS[name]
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(
        cls(**kwargs), attn_implementation=attn_implementation, dtype=torch.float32
    )


@functools.cache
def sharpened(name: str) -> dict[str, torch.Tensor]:
    """The architecture's weights after `SHARPEN_STEPS` seeded Adam steps (fp32, eager attention) on batches of
    sequences that repeat a random pattern of 3-6 tokens: the same bytes every run."""
    model = _construct(name, "eager")
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # dropout, where a config has it
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(SHARPEN_STEPS):
        period = int(torch.randint(3, 7, (1,), generator=gen))
        pattern = torch.randint(3, VOCAB, (16, period), generator=gen)
        batch = pattern.repeat(1, 48 // period + 1)[:, :48]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@functools.cache
def build(name: str, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The architecture's tiny model on `attn_implementation`, chosen at construction (Falcon cannot switch later),
    with its `sharpened` weights: the same weights whatever the backend or dtype."""
    model = _construct(name, attn_implementation)
    model.load_state_dict(sharpened(name))
    return model.to(dtype).eval()


def supports(name: str, backend: str) -> bool:
    """Whether transformers can run this architecture on `backend` ("flash" for flash-attention)."""
    cls = T.AutoModelForCausalLM._model_mapping[CONFIGS[name][0]]
    flag = {"sdpa": "_supports_sdpa", "flash": "_supports_flash_attn"}.get(backend)
    return flag is None or bool(getattr(cls, flag, False))
