"""KVState: whatever was committed, cropped, selected or compacted, a row's next logits equal a fresh forward over
exactly that row's live tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from jf_core.decoding.common import StopTokens, left_pad
from jf_core.decoding.kv import KVState
from tests import flash_standin
from tests.conftest import PAD, VOCAB


def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def window_step(kv: KVState, windows: list[list[int]], keep: list[int]) -> None:
    width = max(map(len, windows))
    tokens = torch.full((len(windows), width), PAD)
    for i, w in enumerate(windows):
        tokens[i, : len(w)] = torch.tensor(w)
    rel = torch.arange(width).expand(len(windows), width)
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool)).expand(len(windows), width, width)
    with torch.inference_mode():
        kv.forward(tokens, rel, causal)
    live = torch.zeros(len(windows), width, dtype=torch.bool)
    for i, k in enumerate(keep):
        live[i, :k] = True
    kv.keep(live)


def next_logits(kv: KVState, tokens: list[int]) -> torch.Tensor:
    """Logits of one more token per row without committing it."""
    batch = kv.batch_size
    with torch.inference_mode():
        logits = kv.forward(
            torch.tensor(tokens)[:, None],
            torch.zeros(batch, 1, dtype=torch.long),
            torch.ones(batch, 1, 1, dtype=torch.bool),
        )
    kv.keep(torch.zeros(batch, 1, dtype=torch.bool))
    return logits[:, -1]


def build(model, prompts):
    ids, mask = left_pad(prompts, PAD, torch.device("cpu"))
    with torch.inference_mode():
        kv, last = KVState.prefill(model, ids, mask)
    return kv, last


def test_prefill_matches_unpadded_forward(tiny_model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    _, last = build(tiny_model, prompts)
    for row, p in enumerate(prompts):
        torch.testing.assert_close(last[row], fresh_logits(tiny_model, p), rtol=1e-4, atol=1e-4)


def test_partial_commits_leave_exact_cache(tiny_model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    kv, _ = build(tiny_model, prompts)
    seqs = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(0)
    for keep in ([3, 1, 4], [1, 2, 2], [4, 4, 1]):
        windows = [torch.randint(3, VOCAB, (4,), generator=g).tolist() for _ in prompts]
        window_step(kv, windows, keep)
        for s, w, k in zip(seqs, windows, keep, strict=False):
            s += w[:k]
    assert kv.lengths.tolist() == [len(s) for s in seqs]
    probe = [20, 21, 22]
    got = next_logits(kv, probe)
    for row, s in enumerate(seqs):
        torch.testing.assert_close(got[row], fresh_logits(tiny_model, [*s, probe[row]]), rtol=1e-4, atol=1e-4)


def test_trailing_dead_slots_are_cropped(tiny_model):
    kv, _ = build(tiny_model, [[5, 6, 7], [8, 9, 10]])
    window_step(kv, [[1, 2, 3, 4], [1, 2, 3, 4]], [2, 1])
    assert kv.slots == 3 + 2
    assert kv.cache.get_seq_length() == kv.slots


def test_compact_and_select_rows_preserve_logits(tiny_model):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [10, 11], [12, 13, 14, 15]]
    kv, _ = build(tiny_model, prompts)
    seqs = [list(p) for p in prompts]
    window = [30, 31, 32, 33, 34, 35]
    for keep in ([6, 1, 3], [1, 6, 2]):
        window_step(kv, [window] * 3, keep)
        for s, k in zip(seqs, keep, strict=False):
            s += window[:k]
    assert kv.waste > 0.2
    kv.compact(min_waste=0.0)
    assert kv.slots == max(len(s) for s in seqs)
    assert kv.lengths.tolist() == [len(s) for s in seqs]
    kv.select_rows(torch.tensor([0, 2]))
    seqs = [seqs[0], seqs[2]]
    got = next_logits(kv, [40, 41])
    for row, s in enumerate(seqs):
        torch.testing.assert_close(got[row], fresh_logits(tiny_model, [*s, [40, 41][row]]), rtol=1e-4, atol=1e-4)


def test_misuse_is_reported(tiny_model):
    kv, _ = build(tiny_model, [[5, 6]])
    with pytest.raises(ValueError, match="keep"):
        kv.keep(torch.ones(1, 3, dtype=torch.bool))
    with torch.inference_mode():
        kv.forward(torch.tensor([[1, 2]]), torch.arange(2)[None], torch.tril(torch.ones(1, 2, 2, dtype=torch.bool)))
        with pytest.raises(RuntimeError, match="unsettled"):
            kv.forward(torch.tensor([[1]]), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 1, dtype=torch.bool))


@pytest.mark.parametrize("prompts", [[[5, 6, 7, 8]], [[5, 6, 7, 8, 9], [10, 11]]], ids=["no holes", "padded rows"])
def test_causal_window_shorthand_matches_fresh_forward(tiny_model, prompts):
    """forward(tokens) alone is the Jacobi hot path (a ready 4D mask on SDPA): every window position's logits equal
    a fresh forward."""
    kv, _ = build(tiny_model, prompts)
    window = [30, 31, 32]
    with torch.inference_mode():
        logits = kv.forward(torch.tensor([window] * len(prompts)))
    kv.keep(torch.ones(len(prompts), len(window), dtype=torch.bool))
    for row, p in enumerate(prompts):
        for j in range(len(window)):
            want = fresh_logits(tiny_model, [*p, *window[: j + 1]])
            torch.testing.assert_close(logits[row, j], want, rtol=1e-4, atol=1e-4)
    assert kv.lengths.tolist() == [len(p) + len(window) for p in prompts]
    assert kv.forwards == {"4d": 2}


def test_flash_path_is_exact_with_holes_ragged_windows_and_falls_back_for_trees(tiny_model):
    """On a backend that takes only 2D masks (the flash-attention stand-in refuses anything else), left padding,
    rejected-slot holes and ragged windows all run as 2D padding masks, exactly; a tree runs on SDPA."""
    flash = flash_standin.use(copy.deepcopy(tiny_model))
    prompts = [[5, 6, 7, 8, 9, 10, 11], [10, 11], [12, 13, 14, 15]]
    kv, last = build(flash, prompts)
    for row, p in enumerate(prompts):
        torch.testing.assert_close(last[row], fresh_logits(tiny_model, p), rtol=1e-4, atol=1e-4)
    seqs = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(0)
    for widths, keep in (([4, 2, 3], [1, 2, 3]), ([3, 4, 1], [3, 1, 1]), ([2, 2, 4], [2, 1, 2])):
        windows = [torch.randint(3, VOCAB, (w,), generator=g).tolist() for w in widths]
        width = max(widths)
        tokens = torch.full((3, width), PAD)
        live = torch.zeros(3, width, dtype=torch.bool)
        for i, w in enumerate(windows):
            tokens[i, : len(w)], live[i, : len(w)] = torch.tensor(w), True
        with torch.inference_mode():
            logits = kv.forward_causal(tokens, live)
        for row, w in enumerate(windows):  # every live window position, against a fresh forward
            for j in range(len(w)):
                want = fresh_logits(tiny_model, [*seqs[row], *w[: j + 1]])
                torch.testing.assert_close(logits[row, j], want, rtol=1e-4, atol=1e-4)
        kept = torch.zeros(3, width, dtype=torch.bool)
        for row, k in enumerate(keep):
            kept[row, :k] = True
            seqs[row] += windows[row][:k]
        kv.keep(kept)
    assert kv.waste > 0 and kv.forwards == {"2d": 4}
    got = next_logits(kv, [40, 41, 42])  # a tree-form forward (explicit positions and mask): SDPA
    for row, s in enumerate(seqs):
        torch.testing.assert_close(got[row], fresh_logits(tiny_model, [*s, [40, 41, 42][row]]), rtol=1e-4, atol=1e-4)
    assert kv.forwards == {"2d": 4, "fallback": 1}
    assert flash.config._attn_implementation == flash_standin.NAME  # back on flash after the tree


def test_forward_takes_positions_and_mask_together(tiny_model):
    kv, _ = build(tiny_model, [[5, 6]])
    with torch.inference_mode(), pytest.raises(ValueError, match="together"):
        kv.forward(torch.tensor([[1, 2]]), torch.arange(2)[None])


def test_eager_attention_gets_an_additive_mask(tiny_model):
    """Eager attention adds the mask to the scores, so the boolean masks of padded rows and trees are converted."""
    eager = copy.deepcopy(tiny_model)  # its own config: the session's model keeps SDPA
    eager.set_attn_implementation("eager")
    assert tiny_model.config._attn_implementation == "sdpa"
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    kv, last = build(eager, prompts)
    for row, p in enumerate(prompts):
        torch.testing.assert_close(last[row], fresh_logits(tiny_model, p), rtol=1e-4, atol=1e-4)
    got = next_logits(kv, [40, 41])
    for row, p in enumerate(prompts):
        torch.testing.assert_close(got[row], fresh_logits(tiny_model, [*p, [40, 41][row]]), rtol=1e-4, atol=1e-4)


def test_a_model_that_trains_on_flex_attention_decodes_on_sdpa(monkeypatch):
    """The round's TPF probe and on-policy states decode the model being trained, which on CUDA runs
    FlexAttention: under `decoding_attention` every forward goes through SDPA (the stand-in FlexAttention refuses to
    run), the tokens equal the SDPA model's, and the model trains on FlexAttention again afterwards."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from jf_core.decoding.backends import decoding_attention
    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
    from tests.conftest import _qwen2

    def refuse(*_a, **_k):
        raise AssertionError("a decoder ran FlexAttention")

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "flex_attention", refuse)
    sdpa, trained = _qwen2(), _qwen2()
    trained.config._attn_implementation = "flex_attention"  # as training_attention sets it on CUDA
    prompts = [[5, 9, 13, 2], [7, 3]]
    cfg = JacobiConfig(block_size=4, max_new_tokens=12)
    with pytest.raises(AssertionError, match="ran FlexAttention"):
        jacobi_decode(trained, prompts, cfg, stop=StopTokens(None, PAD))
    with decoding_attention(trained):
        out = jacobi_decode(trained, prompts, cfg, stop=StopTokens(None, PAD))
    assert out.sequences == jacobi_decode(sdpa, prompts, cfg, stop=StopTokens(None, PAD)).sequences
    assert trained.config._attn_implementation == "flex_attention"
