"""The architecture matrix: every decoder (Jacobi, multi-block, recycling), batch 1 and 3, on every attention
backend transformers runs the architecture on (SDPA, eager, and flash-attention through the strict stand-in),
token for token equal to HF greedy `generate` (stock transformers, an unpacked model) in fp32, sliding windows
shorter than the sequence included, and every case accepting several drafts in some forward (the weights are
sharpened for that: architectures.py).

Not in the matrix, by transformers' own limits: SDPA for Gemma2 and GPT-OSS (eager only), flash-attention for
GPT-OSS (hub kernels with attention sinks), flash-attention for Falcon (its own flash code, outside the attention
interface, so no registered stand-in reaches it), and flash-attention for GPT-2 in fp32 (transformers' flash wrapper
cannot pick a dtype for its Conv1D layers; real flash-attention only runs fp16/bf16, checked below in bf16).
Models the decoders cannot run exactly are refused at load, naming why (the end of this file).
"""

from __future__ import annotations

import pytest
import torch

from jf_core.decoding import decode
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.kv import KVState, UnsupportedModelError, attention_layout
from jf_core.evaluation.methods import hf_generate_decoder
from tests import flash_standin
from tests.jf_core.decoding.architectures import CONFIGS, DECODERS, NEW, PROMPTS, WINDOW, build, supports

pytestmark = pytest.mark.timeout(900)
BACKENDS = {"sdpa": "sdpa", "eager": "eager", "flash": flash_standin.NAME}


def _cases():
    for arch in CONFIGS:
        for backend in BACKENDS:
            if not supports(arch, backend) or (backend == "flash" and arch in ("gpt2", "gpt-oss-window", "falcon")):
                continue
            yield arch, backend


@pytest.fixture(scope="module", autouse=True)
def _standin():
    flash_standin.install()


_REFERENCE: dict[str, list[list[int]]] = {}


def reference(arch: str) -> list[list[int]]:
    """HF greedy generate, one prompt at a time, on the architecture's eager model (the plainest attention)."""
    if arch not in _REFERENCE:
        _REFERENCE[arch] = hf_generate_decoder(build(arch, "eager"), StopTokens(None, 0), NEW, batched=False)(
            PROMPTS
        ).sequences
    return _REFERENCE[arch]


def run(model, name: str, prompts):
    return decode(model, prompts, DECODERS[name], stop=StopTokens(None, 0)).sequences


def accepted_most(model, name: str, prompts) -> int:
    """The most tokens one forward accepted for one sequence, over `prompts` decoded together."""
    return max(decode(model, prompts, DECODERS[name], stop=StopTokens(None, 0)).stats.accepted_histogram())


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize(("arch", "backend"), list(_cases()))
def test_lossless_on_every_architecture_and_backend(arch, backend, decoder, monkeypatch):
    model = build(arch, BACKENDS[backend])
    paths: dict[str, int] = {}
    original = KVState._call

    def spy(self, tokens, positions, mask, path, **kw):
        paths[path] = paths.get(path, 0) + 1
        return original(self, tokens, positions, mask, path, **kw)

    monkeypatch.setattr(KVState, "_call", spy)
    want = reference(arch)
    alone = [run(model, decoder, [p])[0] for p in PROMPTS]
    together = run(model, decoder, PROMPTS)
    assert alone == want, f"{arch}/{backend}/{decoder} batch 1"
    assert together == want, f"{arch}/{backend}/{decoder} batch 3"
    # The multi-token paths ran: some forward accepted a run of drafts (the sharpened weights' doing).
    assert accepted_most(model, decoder, PROMPTS) >= 2, f"{arch}/{backend}/{decoder}: one token a forward at most"
    if backend == "flash":  # the 2D path carried every forward it can: all but recycling's trees
        assert paths.get("2d", 0) > 0 and "4d" not in paths, paths
        assert getattr(DECODERS[decoder], "pool_size", 0) or set(paths) == {"2d"}, paths
    else:
        assert set(paths) == {"4d"}, paths


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_the_sharpened_models_still_read_their_context(arch):
    """Sharpening makes drafts acceptable without making the text a function of the last token alone: prompts that
    end alike but differ before continue differently (HF greedy generate, eager)."""
    model = build(arch, "eager")
    probe = [[1, 2, 3, 4, 12], [10, 11, 12], [7, 12]]
    texts = hf_generate_decoder(model, StopTokens(None, 0), 12, batched=False)(probe).sequences
    assert len({tuple(t) for t in texts}) > 1, texts


def test_windows_are_in_play():
    """Every windowed architecture's layout says so, and the test sequences outrun its window."""
    windowed = {a for a in CONFIGS if a.endswith("window")}
    for arch in windowed:
        assert attention_layout(build(arch, "eager")).max_window == WINDOW, arch
    assert attention_layout(build("qwen2-hybrid-window", "eager")).hybrid
    assert max(map(len, PROMPTS)) > WINDOW and NEW > WINDOW


def test_gpt2_on_flash_in_bf16_never_sees_a_4d_mask():
    """GPT-2 on the stand-in as real flash-attention runs it (bf16 only): every decoder completes, nothing but 2D
    masks reach flash-attention, trees go to SDPA."""
    model = flash_standin.use(build("gpt2", "sdpa", torch.bfloat16), strict_dtype=True)
    try:
        for name in DECODERS:
            seqs = run(model, name, PROMPTS)
            assert [len(s) for s in seqs] == [NEW] * len(PROMPTS)
    finally:
        flash_standin.use(model, strict_dtype=False)


@pytest.mark.parametrize(
    ("build_model", "message"),
    [
        (
            lambda: __import__("transformers").MambaForCausalLM(
                __import__("transformers").MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=1)
            ),
            "recurrent state in its linear_attention layers",
        ),
        (  # its layers read as full attention: refused because it cannot take a KV cache at all
            lambda: __import__("transformers").RwkvForCausalLM(
                __import__("transformers").RwkvConfig(
                    vocab_size=64, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32
                )
            ),
            "recurrent state in a cache of its own",
        ),
        (
            lambda: __import__("transformers").Llama4ForCausalLM(
                __import__("transformers").Llama4TextConfig(
                    vocab_size=64,
                    hidden_size=32,
                    intermediate_size=64,
                    intermediate_size_mlp=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    head_dim=8,
                    attention_chunk_size=8,
                    num_local_experts=2,
                )
            ),
            "chunked_attention",
        ),
        (
            lambda: __import__("transformers").FalconForCausalLM(
                __import__("transformers").FalconConfig(
                    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True
                )
            ),
            "ALiBi",
        ),
        (
            lambda: __import__("transformers").BloomForCausalLM(
                __import__("transformers").BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
            ),
            "ALiBi",
        ),
    ],
    ids=["mamba", "rwkv", "llama4-chunked", "falcon-alibi", "bloom"],
)
def test_unsupported_attention_is_refused_by_name(build_model, message):
    """Refused by name by the layout check, and by every decoder, the AR baseline included: before the check,
    ALiBi models crashed inside transformers' build_alibi_tensor, and AR on Mamba returned wrong tokens from the
    second token on (its forward takes `cache`, so the KV cache passed went unused)."""
    model = build_model().eval()
    with pytest.raises(UnsupportedModelError, match=message):
        attention_layout(model)
    for name in ("ar", "jacobi"):
        with pytest.raises(UnsupportedModelError, match=message):
            if name == "ar":
                ar_decode(model, [[5, 6, 7], [8, 9], [1, 2, 3, 4]], max_new_tokens=4, stop=StopTokens(None, 0))
            else:
                run(model, "jacobi", [[5, 6, 7]])


def test_forwards_pass_the_cache_under_the_name_the_model_takes():
    """transformers renamed `past_key_values` to `cache` (the old name warns on every forward and goes in 5.40);
    models not yet converted still take the old name. Either way the decoders pass the cache the model reads."""
    import warnings

    from jf_core.decoding.kv import cache_kwargs

    llama, gpt2 = build("llama"), build("gpt2")
    assert "cache" in cache_kwargs(llama, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated-argument FutureWarning would fail here
        assert run(llama, "jacobi", PROMPTS[:1]) == reference("llama")[:1]
        ar = ar_decode(llama, PROMPTS[:1], max_new_tokens=NEW, stop=StopTokens(None, 0)).sequences
    assert ar == reference("llama")[:1]
    name = next(iter(cache_kwargs(gpt2, None)))
    assert name in __import__("inspect").signature(type(gpt2).forward).parameters


def test_layouts_read_transformers_517_layer_kwargs(monkeypatch):
    """transformers 5.17 (the lent GPU machines' image) returns one kwargs dict for all layers where 5.24 returns
    one per layer: the same layouts come out of both shapes, hybrid windows included."""
    import transformers.cache_utils as cache_utils

    current = cache_utils.get_layer_types_and_kwargs

    def as_517(config):
        types, per_layer = current(config)
        shared = {}
        for kw in per_layer:
            shared.update({k: v for k, v in kw.items() if v is not None})
        return types, shared

    archs = ["qwen2", "mistral-window", "qwen2-hybrid-window", "gemma3-window"]
    want = {a: attention_layout(build(a, "eager")) for a in archs}
    monkeypatch.setattr(cache_utils, "get_layer_types_and_kwargs", as_517)
    assert {a: attention_layout(build(a, "eager")) for a in archs} == want
