"""The cycle clock times a decode's parts without changing what it decodes."""

from __future__ import annotations

from jf_core.decoding import JFDecodeConfig, ar_decode
from jf_core.decoding.clock import CycleClock
from jf_core.decoding.multiblock import JFDecoder
from jf_core.models import stop_tokens

PROMPT = "program: a=85; step -8; return f"


def test_a_clocked_decode_is_the_same_decode_and_its_parts_fit_inside_its_wall_time(embedded):
    model, tok = embedded
    stop = stop_tokens(model, tok)
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    config = JFDecodeConfig(block_size=16, num_blocks=2, pool_size=2, lookup=8, max_new_tokens=48)
    plain = JFDecoder(model, config, stop=stop).decode([ids])
    clock = CycleClock()
    with clock.watching_head(model):
        timed = JFDecoder(model, config, stop=stop, clock=clock).decode([ids])
    assert timed.sequences == plain.sequences
    assert timed.stats.batch_forwards == clock.cycles == plain.stats.batch_forwards
    assert {"layout", "tensors", "forward", "head", "pick", "verify", "keep", "drop+compact"} == set(clock.seconds)
    parts = sum(s for p, s in clock.seconds.items() if p != "head")
    assert 0 < clock.seconds["head"] < clock.seconds["forward"]
    assert parts <= timed.stats.decode_seconds
    assert clock.slots >= clock.cycles  # every forward runs at least the window's first token
    # What each slot earned: every slot past a forward's root counted once, and the accepted ones are exactly the
    # tokens each forward committed past its known-correct first.
    assert sum(laid for laid, _ in clock.outcomes.values()) == clock.slots - clock.cycles
    assert sum(ok for _, ok in clock.outcomes.values()) == sum(a - 1 for s in timed.stats.sequences for a in s.accepted)
    assert {"window", "lookup"} <= {owner for owner, _ in clock.outcomes} and clock.bookkeeping >= 0
    # Who won each forward: one winner a forward, no one exactly where the forward committed only its known-correct
    # token, and both the window and the lookup winning some.
    assert sum(clock.wins.values()) == clock.cycles
    assert clock.wins[None] == sum(a == 1 for s in timed.stats.sequences for a in s.accepted)
    assert clock.wins["lookup"] > 0 and clock.wins["window"] > 0, clock.wins


def test_ar_counts_one_slot_a_cycle_and_the_head_is_unhooked_afterwards(embedded):
    model, tok = embedded
    stop = stop_tokens(model, tok)
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    clock = CycleClock()
    with clock.watching_head(model):
        out = ar_decode(model, [ids], max_new_tokens=24, stop=stop, clock=clock)
    assert clock.cycles == out.stats.batch_forwards == clock.slots
    assert {"forward", "head", "pick", "verify", "tensors"} == set(clock.seconds)
    head = clock.seconds["head"]
    ar_decode(model, [ids], max_new_tokens=8, stop=stop)
    assert clock.seconds["head"] == head  # the hooks went with the context
