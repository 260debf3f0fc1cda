"""Multi-block decoding and rejection recycling are lossless: token for token `model.generate(do_sample=False)`,
across n, K, pool_size, r, seeded drafts, batch 1 and > 1, EOS mid-block, with and without the draft EOS cut, on two
architectures and the embedded model; and the add-ons actually engage (recycled candidates win, drafts are seeded,
blocks are spawned)."""

from __future__ import annotations

import pytest

from jf_core.decoding.common import StopTokens
from jf_core.decoding.multiblock import JFDecodeConfig, JFDecoder, jf_decode
from tests.conftest import PAD
from tests.jf_core.decoding.test_jacobi import MAX_NEW, prompts, reference

# Adaptive width (width.py) as the lossless matrix runs it: off; narrow windows; narrow windows with AR steps for
# rows that accept little (the tiny random models accept about one token a forward, so they spend most forwards so).
WIDTHS = {
    "full width": {},
    "adaptive width": {"adaptive_width": True, "width_scale": 1.0, "width_margin": 1, "width_floor": 2},
    "adaptive + AR steps": {"adaptive_width": True, "width_margin": 0, "width_floor": 2, "ar_below": 1.5},
}


def decode_all(model, ps, cfg, eos, batch):
    got = []
    for start in range(0, len(ps), batch):
        got += jf_decode(model, ps[start : start + batch], cfg, stop=StopTokens(eos, PAD)).sequences
    return got


@pytest.mark.parametrize(
    ("n", "k", "pool", "r"),
    [(4, 2, 0, 0.85), (8, 3, 0, 0.5), (7, 1, 4, 0.85), (16, 2, 4, 0.85), (64, 2, 4, 0.85), (5, 4, 2, 0.25),
     (16, 2, 1, 1.0)],
)  # fmt: skip
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("seed_drafts", [False, True], ids=["sampled drafts", "seeded drafts"])
@pytest.mark.parametrize("width", list(WIDTHS))
def test_multiblock_and_recycling_equal_generate(tiny_model, n, k, pool, r, batch, seed_drafts, width):
    ps = prompts(4, seed=1)
    expected = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    cfg = JFDecodeConfig(
        block_size=n,
        num_blocks=k,
        pool_size=pool,
        spawn_ratio=r,
        max_new_tokens=MAX_NEW,
        seed_drafts=seed_drafts,
        **WIDTHS[width],
    )
    assert decode_all(tiny_model, ps, cfg, None, batch) == expected


@pytest.mark.parametrize("cut", [True, False], ids=["eos cut", "no eos cut"])
@pytest.mark.parametrize(("n", "k", "pool"), [(4, 2, 4), (8, 3, 0), (16, 2, 4)])
@pytest.mark.parametrize("width", list(WIDTHS))
def test_eos_mid_block(tiny_model, n, k, pool, cut, width):
    ps = prompts(4, seed=3)
    free = [reference(tiny_model, p, MAX_NEW, None) for p in ps]
    eos = free[0][n // 2 + 3]
    expected = [reference(tiny_model, p, MAX_NEW, eos) for p in ps]
    assert any(len(e) < MAX_NEW for e in expected)
    cfg = JFDecodeConfig(
        block_size=n,
        num_blocks=k,
        pool_size=pool,
        spawn_ratio=0.5,
        max_new_tokens=MAX_NEW,
        cut_at_draft_eos=cut,
        **WIDTHS[width],
    )
    assert decode_all(tiny_model, ps, cfg, eos, 4) == expected


def test_draft_eos_cut_runs_fewer_tokens_for_the_same_output(embedded):
    """On the embedded model at n=64, most of an answer's last block lies past its EOS: cutting the window at the
    draft's EOS leaves the output as it was and runs fewer window tokens."""
    from jf_core.decoding.ar import ar_decode
    from jf_core.toy.task import make_split

    model, tok = embedded
    ps = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 6)]
    ids = StopTokens(tok.eos_token_id, tok.pad_token_id)
    expected = ar_decode(model, ps, max_new_tokens=160, stop=ids).sequences
    ran = {}
    for cut in (False, True):
        width: list[int] = []
        hook = model.register_forward_pre_hook(
            lambda _m, _a, kw, width=width: width.append(kw["input_ids"].numel()), with_kwargs=True
        )
        try:
            cfg = JFDecodeConfig(block_size=64, num_blocks=2, pool_size=0, max_new_tokens=160, cut_at_draft_eos=cut)
            assert jf_decode(model, ps, cfg, stop=ids).sequences == expected
        finally:
            hook.remove()
        ran[cut] = sum(width)
    assert ran[True] < ran[False]


@pytest.mark.parametrize("width", list(WIDTHS))
def test_max_new_tokens_is_exact(tiny_model, width):
    ps = prompts(2, seed=7)
    for max_new in (1, 2, 5, 17):
        cfg = JFDecodeConfig(
            block_size=4, num_blocks=3, pool_size=2, spawn_ratio=0.25, max_new_tokens=max_new, **WIDTHS[width]
        )
        assert decode_all(tiny_model, ps, cfg, None, 2) == [reference(tiny_model, p, max_new, None) for p in ps]


def test_embedded_model_lossless_and_the_add_ons_engage(embedded):
    from jf_core.decoding.ar import ar_decode
    from jf_core.toy.task import make_split

    model, tok = embedded
    ps = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 6)]
    expected = ar_decode(model, ps, max_new_tokens=160, stop=StopTokens(tok.eos_token_id, tok.pad_token_id))
    cfg = JFDecodeConfig(
        block_size=16, num_blocks=2, pool_size=4, spawn_ratio=0.5, max_new_tokens=160, seed_drafts=True
    )
    decoder = JFDecoder(model, cfg, stop=StopTokens(tok.eos_token_id, tok.pad_token_id))
    seqs = [decoder.new_sequence(i, p) for i, p in enumerate(ps)]
    decoder.new_sequence = lambda i, p: seqs[i]  # keep handles on the sequences to read their counters
    out = decoder.decode(ps)
    assert out.sequences == expected.sequences
    assert sum(s.spawned for s in seqs) > 0
    assert sum(s.wins["recycling"] for s in seqs) > 0
    assert sum(s.memory["recycling"].seeded for s in seqs) > 0


def test_recorder_is_refused_and_bad_configs_are_named(tiny_model):
    with pytest.raises(ValueError, match="num_blocks"):
        JFDecodeConfig(num_blocks=0)
    with pytest.raises(ValueError, match="spawn_ratio"):
        JFDecodeConfig(spawn_ratio=0.0)
    with pytest.raises(ValueError, match="BlockRecorder"):
        JFDecoder(tiny_model, JFDecodeConfig(), stop=StopTokens(None, PAD), recorder=object())
