"""Lossless sampling. (1) Identity: in fp32, every decoder (Jacobi, multi-block, recycling, seeded drafts) returns
token for token what the AR sampler draws with the same seeds, for many seeds, at batch 1 and 4, on the embedded
model (sharp: several tokens accepted per forward) and on tiny random Qwen2/Llama. (2) Distribution: our samples and
Hugging Face `generate(do_sample=True)` with the same temperature/top-k/top-p agree on first-token and bigram
frequencies (two-sample chi-square, significance level 0.001), and the same test tells a different temperature
apart (it has the power to fail)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from jf_core.decoding import decode
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.decoding.sampling import Sampler, Sampling, gumbel_noise
from jf_core.toy.task import make_split
from tests.conftest import PAD

CONFIGS = {
    "jacobi-n4": JacobiConfig(block_size=4, max_new_tokens=48),
    "jacobi-n16": JacobiConfig(block_size=16, max_new_tokens=48),
    "multiblock": JFDecodeConfig(block_size=8, num_blocks=3, pool_size=0, max_new_tokens=48),
    "recycling": JFDecodeConfig(block_size=16, num_blocks=2, pool_size=4, seed_drafts=True, max_new_tokens=48),
    "adaptive": JFDecodeConfig(block_size=16, num_blocks=2, max_new_tokens=48, adaptive_width=True, width_margin=1),
    "lookup": JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, max_new_tokens=48),
}
# The embedded model is sharp: below temperature 2 its samples are greedy's text, which would test nothing.
SAMPLINGS = [Sampling(temperature=2.0), Sampling(temperature=3.0, top_k=5, top_p=0.98)]
ALPHA = 0.001


def test_the_noise_is_a_pure_function_of_seed_position_and_token():
    seeds, positions = torch.tensor([3, 3, 4]), torch.tensor([[0, 1], [0, 1], [0, 1]])
    g = gumbel_noise(seeds, positions, 50)
    assert torch.equal(g, gumbel_noise(seeds, positions, 50))
    assert torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2]) and not torch.equal(g[0, 0], g[0, 1])
    assert torch.equal(g[0, 1], gumbel_noise(torch.tensor([3]), torch.tensor([[1]]), 50)[0, 0])  # no batch effect
    assert torch.isfinite(g).all()


def test_bad_sampling_parameters_are_named():
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        Sampling(top_k=-1)
    with pytest.raises(ValueError, match="seeds: 1 given for 2 prompts"):
        Sampler(Sampling(), [1], 2)
    with pytest.raises(ValueError, match="temperature must be >= 0, got -1"):
        Sampling.of(-1)


def test_callers_settings_read_as_greedy_or_sampling():
    assert Sampling.of(0) is None and Sampling.of(None, top_k=5) is None  # 0 or absent: greedy
    assert Sampling.of(0.7) == Sampling(0.7, top_k=0, top_p=1.0)  # absent filters: none
    assert Sampling.of(2, top_k=5, top_p=0.9) == Sampling(2.0, top_k=5, top_p=0.9)


def test_the_sampler_keeps_the_vocabulary_keys():
    sampler = Sampler(Sampling(), [7], 1)
    logits, positions = torch.randn(1, 3, 50), torch.tensor([[4, 5, 6]])
    first = sampler.pick(logits, [0], positions)
    assert len(sampler._vocab_keys) == 1
    assert torch.equal(first, sampler.pick(logits, [0], positions)) and len(sampler._vocab_keys) == 1
    assert torch.equal(first, (logits + gumbel_noise(torch.tensor([7]), positions, 50)).argmax(-1))


_AR: dict[tuple, list[list[int]]] = {}


def ar_sequences(model, prompts, sampling, seeds, stops) -> list[list[int]]:
    """The AR sampler's (or greedy's) sequences, drawn once per prompts and seeds: every decoder's case compares with
    the same draws (the embedded model is the session's one, never changed)."""
    key = (id(model), tuple(map(tuple, prompts)), sampling, tuple(seeds or ()), stops)
    if key not in _AR:
        _AR[key] = ar_decode(model, prompts, max_new_tokens=48, sampling=sampling, seeds=seeds, stop=stops).sequences
    return _AR[key]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t2", "t3-k5-p0.98"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_every_decoder_draws_the_ar_sample_of_the_same_seeds(embedded, method, batch, sampling):
    model, tok = embedded
    examples = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 4)]
    stops = StopTokens(tok.eos_token_id, tok.pad_token_id)
    greedy = ar_sequences(model, examples, None, None, stops)
    accepted, forwards, sampled = 0, 0, 0
    for start in range(0, 12, batch):  # 12 seeds per case
        seeds = [start + i for i in range(batch)]
        prompts = [examples[s % 4] for s in seeds]
        want = ar_sequences(model, prompts, sampling, seeds, stops)
        out = decode(model, prompts, CONFIGS[method], sampling=sampling, seeds=seeds, stop=stops)
        assert out.sequences == want, f"seeds {seeds}"
        accepted += sum(len(s) for s in out.sequences)
        forwards += sum(s.forwards for s in out.stats.sequences)
        sampled += sum(got != greedy[s % 4] for got, s in zip(out.sequences, seeds, strict=True))
    assert accepted - forwards >= 20  # drafts were accepted: the identity was tested beyond one token per forward
    assert sampled >= 1  # and it does sample: some seeds leave greedy's text


@pytest.mark.parametrize("method", ["jacobi-n4", "recycling", "lookup"])
def test_identity_on_random_architectures(tiny_model, method):
    prompts = [[5, 9, 200, 33], [7, 7, 7], [100, 101, 102, 103, 104], [42]]
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.95)
    stops = StopTokens(None, PAD)
    seeds = [11, 12, 13, 14]
    want = ar_decode(tiny_model, prompts, max_new_tokens=48, sampling=sampling, seeds=seeds, stop=stops)
    out = decode(tiny_model, prompts, CONFIGS[method], sampling=sampling, seeds=seeds, stop=stops)
    assert out.sequences == want.sequences
    alone = decode(tiny_model, prompts[2:3], CONFIGS[method], sampling=sampling, seeds=seeds[2:3], stop=stops)
    assert alone.sequences[0] == want.sequences[2]  # a request's text does not depend on its batch


# -- in distribution against Hugging Face ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def peaked_model():
    """A tiny random Qwen2 with large weights: distributions far from uniform, so a wrong temperature shows."""
    torch.manual_seed(3)
    cfg = Qwen2Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.3,
        pad_token_id=PAD,
        bos_token_id=None,
        eos_token_id=None,
    )
    return Qwen2ForCausalLM(cfg).eval()


def chi_square_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity; categories with fewer than 10 samples in all are pooled."""
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rows = [(a[k], b[k]) for k in keys]
    rest = (sum(a.values()) - sum(r[0] for r in rows), sum(b.values()) - sum(r[1] for r in rows))
    if sum(rest):
        rows.append(rest)
    na, nb = sum(r[0] for r in rows), sum(r[1] for r in rows)
    stat = 0.0
    for x, y in rows:
        ea, eb = na * (x + y) / (na + nb), nb * (x + y) / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    dof = len(rows) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def hf_samples(model, prompt: list[int], sampling: Sampling, n: int) -> list[tuple[int, int]]:
    torch.manual_seed(1234)
    config = GenerationConfig(
        do_sample=True,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        max_new_tokens=2,
        min_new_tokens=2,
        pad_token_id=PAD,
        eos_token_id=None,
    )
    ids = torch.tensor([prompt] * n)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return [tuple(row) for row in out[:, len(prompt) :].tolist()]


def our_samples(model, prompt: list[int], sampling: Sampling, n: int) -> list[tuple[int, int]]:
    config = JFDecodeConfig(block_size=2, num_blocks=2, pool_size=2, max_new_tokens=2)
    out = decode(model, [prompt] * n, config, sampling=sampling, seeds=range(n), stop=StopTokens(None, PAD))
    return [tuple(s) for s in out.sequences]


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.8, top_k=12, top_p=0.9), Sampling(temperature=1.3)])
def test_samples_match_hf_generate_in_distribution(peaked_model, sampling):
    prompt, n = [3, 17, 8], 4000
    ours, theirs = our_samples(peaked_model, prompt, sampling, n), hf_samples(peaked_model, prompt, sampling, n)
    first = chi_square_p(Counter(s[0] for s in ours), Counter(s[0] for s in theirs))
    bigram = chi_square_p(Counter(ours), Counter(theirs))
    assert first > ALPHA and bigram > ALPHA, (first, bigram)
    hotter = hf_samples(peaked_model, prompt, Sampling(sampling.temperature * 1.5, sampling.top_k, sampling.top_p), n)
    assert chi_square_p(Counter(s[0] for s in ours), Counter(s[0] for s in hotter)) < ALPHA  # the test can fail
