"""Adaptive width (width.py): the policy's arithmetic, its bad settings named, and on the embedded model the same
text as AR from fewer slots, with AR steps taken by rows that accept little. Losslessness across the matrix (n, K,
pool, batch, EOS, max_new_tokens, architectures, sampling, streaming) lives with each decoder's tests."""

from __future__ import annotations

import pytest

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode
from jf_core.decoding.width import RowWidth, WidthPolicy
from jf_core.toy.task import make_split


def test_a_row_runs_about_what_it_accepts():
    policy = WidthPolicy(scale=2.0, margin=3, floor=4, decay=0.5, initial=4.0)
    row = RowWidth(policy.initial)
    assert row.wanted(policy) == 11  # 2 x 4 + 3
    row.observe(policy, run=11, accepted=10)
    assert row.estimate == 7.0 and row.wanted(policy) == 17
    for _ in range(10):
        row.observe(policy, run=17, accepted=1)
    assert row.wanted(policy) == 6  # ceil(2 x ~1.01) + 3 = 6: shrinks toward 2 x 1 + 3 = 5, never below the floor
    assert RowWidth(0.1).wanted(policy) == 4  # the floor


def test_a_row_that_accepts_little_takes_ar_steps_and_probes():
    policy = WidthPolicy(floor=3, ar_below=1.5, probe_every=4)
    row = RowWidth(1.0)
    runs = []
    for _ in range(9):
        run = row.wanted(policy)
        runs.append(run)
        row.observe(policy, run, accepted=1)
    assert runs == [1, 1, 1, 3, 1, 1, 1, 3, 1]  # AR steps; a probe at the floor every 4th forward
    row.observe(policy, 3, accepted=3)  # the probe found a predictable stretch: the estimate rises, AR steps stop
    row.observe(policy, 3, accepted=3)
    assert row.estimate >= 1.5 and row.wanted(policy) > 1


@pytest.mark.parametrize(
    ("field", "value"), [("width_scale", 0.0), ("width_margin", -1), ("width_floor", 0)]
)  # fmt: skip
def test_bad_width_settings_are_named(field, value):
    with pytest.raises(ValueError, match="width policy"):
        JFDecodeConfig(adaptive_width=True, **{field: value})


def test_embedded_model_same_text_from_fewer_slots(embedded):
    """At n=64 with two blocks, full windows run every draft slot; adaptive width runs about what is accepted, and
    the text is AR's either way, at batch 1 and 3."""
    model, tok = embedded
    ids = StopTokens(tok.eos_token_id, tok.pad_token_id)
    ps = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", 6)]
    expected = ar_decode(model, ps, max_new_tokens=160, stop=ids).sequences
    slots = {}
    for adaptive in (False, True):
        ran: list[int] = []  # every forward's input slots (prefills alike in both)
        hook = model.register_forward_pre_hook(
            lambda _m, _a, kw, ran=ran: ran.append(kw["input_ids"].numel()), with_kwargs=True
        )
        try:
            cfg = JFDecodeConfig(block_size=64, num_blocks=2, pool_size=0, max_new_tokens=160, adaptive_width=adaptive)
            for batch in (1, 3):
                got = []
                for start in range(0, len(ps), batch):
                    got += jf_decode(model, ps[start : start + batch], cfg, stop=ids).sequences
                assert got == expected
        finally:
            hook.remove()
        slots[adaptive] = sum(ran)
    assert slots[True] < 0.7 * slots[False]
