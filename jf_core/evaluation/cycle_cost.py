"""What one decoding cycle costs, part by part, in AR steps (`jf bench cycle`).

A decoder's speedup over AR is its TPF divided by what one of its cycles costs in AR steps: on a GPU a wide window
costs about one step, on this CPU it does not, and the accepted tokens a proposer adds are spent again on the cycle.
Here our AR and each decode config decode the same prompts at batch 1 with a `CycleClock` (decoding/clock.py), taking
turns prompt by prompt (the order rotated each prompt, so no method is always first), and every part of a cycle is
reported per cycle: in ms and in AR steps (that part's ms over AR's whole cycle, wall time). `unattributed` is the
decode loop's wall time no part claims (streaming, the loop itself). Every output is checked against AR's.

How far a measured speedup is from a decision: its 95% interval over resampled prompts (a paired bootstrap, as the
evaluation's) says how much it owes to which prompts were drawn, and with `control` our AR decodes each prompt a
second time, timed as a method of its own, so AR against AR says how far the timer moves on the same work. Neither
sees a host that slows between runs: on a 2-core AMD EPYC the same two configs read 1.20x and 1.32x half an hour
apart (2026-12-07, docs/experiments/corpus-size.md); a decision that matters is made on held-out prompts.

What each slot earns (`slot_table`): by who laid it out (the window, each proposer, a draft adapter's chain) and its
depth, the slots laid out a cycle and the tokens they had accepted; beside it a slot's cost (the method's cycle over
AR's, less one AR step, per slot past the first) and the break-even acceptance a slot needs to pay for itself (a slot
accepted with probability p adds p tokens to TPF for its cost c, so it pays where p / TPF > c / cycle), and the
share of forwards each won (whose picks the next forward starts from)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from jf_core.decoding import JacobiConfig, JFDecodeConfig, StopTokens, ar_decode
from jf_core.decoding.clock import CycleClock
from jf_core.decoding.jacobi import JacobiDecoder
from jf_core.decoding.layout import DRAFT_CHAIN
from jf_core.decoding.multiblock import JFDecoder
from jf_core.evaluation.evaluate import LosslessnessError
from jf_core.evaluation.speed import paired_ratio_interval

PARTS = ("layout", "tensors", "forward", "head", "pick", "verify", "keep", "drop+compact")
AR_NAME = "ar"
CONTROL_NAME = "ar_again"  # our AR timed a second time: the timer's own spread


@dataclass
class CycleCost:
    """One method's cycles over every prompt: the parts' seconds, the cycles, the tokens and slots."""

    describe: str
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wall: float = 0.0  # the decode loops' wall time (prefill excluded)
    cycles: int = 0
    new_tokens: int = 0
    forwards: int = 0  # per sequence, prefill included (stats.py's TPF)
    slots: int = 0  # tokens run by the cycles' forwards (batch 1: the window, its branches and chains)
    # (owner, depth) -> [slots laid out, slots accepted] (clock.py `CycleClock.outcomes`)
    outcomes: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    prompt_walls: list[float] = field(default_factory=list)  # each timed prompt's decode loop, in order
    wins: Counter = field(default_factory=Counter)  # each row's forwards by who won them (clock.py `CycleClock.wins`)

    @property
    def tpf(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    def ms(self, part: str) -> float:
        """The part's mean ms per cycle; `unattributed` is the wall time no part claims, `cycle` the whole."""
        if part == "cycle":
            return 1000 * self.wall / self.cycles
        if part == "unattributed":  # `head` is inside `forward`: not counted twice
            return 1000 * (self.wall - sum(s for p, s in self.seconds.items() if p != "head")) / self.cycles
        return 1000 * self.seconds.get(part, 0.0) / self.cycles


def measure_cycles(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    configs: dict[str, JacobiConfig | tuple[torch.nn.Module, JacobiConfig]],
    *,
    max_new_tokens: int,
    stop: StopTokens,
    warmup: int = 1,
    control: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, CycleCost]:
    """{"ar": our AR's cycles on `model`, name: each config's}: every prompt decoded by each at batch 1, taking
    turns (the order rotated prompt by prompt), after `warmup` prompts decoded untimed by each. A config may come
    with its own model (`(model, config)`: another adapter on the same base, whose greedy text is the base's), so
    models are compared in one run. `control`: our AR takes a second turn (`CONTROL_NAME`). Raises
    LosslessnessError when a config's output is not AR's (a greedy decoder's contract)."""
    paired = {n: c if isinstance(c, tuple) else (model, c) for n, c in configs.items()}
    if AR_NAME in paired or CONTROL_NAME in paired:
        raise ValueError(f"a config may not be named {AR_NAME!r} or {CONTROL_NAME!r}: those are our AR's rows")
    names = [AR_NAME, *([CONTROL_NAME] if control else []), *paired]
    again = {CONTROL_NAME: CycleCost("greedy AR, timed again")} if control else {}
    costs = {AR_NAME: CycleCost("greedy AR"), **again, **{n: CycleCost(c.describe()) for n, (_, c) in paired.items()}}
    for i, prompt in enumerate([*prompts[:warmup], *prompts]):
        timed = i >= warmup
        outputs = {}
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            on, config = paired.get(name, (model, None))
            clock = CycleClock(next(on.parameters()).device)
            with clock.watching_head(on):
                out = _decode(on, prompt, config, max_new_tokens=max_new_tokens, stop=stop, clock=clock)
            outputs[name] = out.sequences[0]
            if timed:
                _add(costs[name], clock, out)
        for name, seq in outputs.items():
            if seq != outputs[AR_NAME]:
                raise LosslessnessError(f"{name} ({costs[name].describe}) differs from greedy AR on prompt {i}")
        if progress is not None and timed:
            progress(f"prompt {i - warmup + 1}/{len(prompts)}")
    return costs


def _decode(model, prompt, config: JacobiConfig | None, *, max_new_tokens: int, stop: StopTokens, clock: CycleClock):
    if config is None:
        return ar_decode(model, [prompt], max_new_tokens=max_new_tokens, stop=stop, clock=clock)
    config = replace(config, max_new_tokens=max_new_tokens)
    decoder_class = JFDecoder if isinstance(config, JFDecodeConfig) else JacobiDecoder
    return decoder_class(model, config, stop=stop, clock=clock).decode([prompt])


def _add(cost: CycleCost, clock: CycleClock, out) -> None:
    for part, seconds in clock.seconds.items():
        cost.seconds[part] += seconds
    wall = out.stats.decode_seconds - clock.bookkeeping  # the slots' counting is the bench's, not the decode's
    cost.wall += wall
    cost.prompt_walls.append(wall)
    cost.cycles += clock.cycles
    cost.new_tokens += out.stats.new_tokens
    cost.forwards += out.stats.forwards
    cost.slots += clock.slots
    for key, (laid, accepted) in clock.outcomes.items():
        cost.outcomes[key][0] += laid
        cost.outcomes[key][1] += accepted
    cost.wins.update(clock.wins)


def cost_table(costs: dict[str, CycleCost]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per part, each method's ms per cycle and AR steps (the part's ms over AR's whole cycle);
    then the cycle, its slots, TPF, the speedup TPF / cycle predicts and the one measured (AR's decode time over the
    method's)."""
    ar = costs[AR_NAME]
    step = ar.ms("cycle")
    head = ["part", *(f"{name}: ms (AR steps)" for name in costs)]
    parts = [p for p in PARTS if any(c.seconds.get(p) for c in costs.values())]

    def cell(c: CycleCost, part: str) -> str:
        return f"{c.ms(part):.2f} ({c.ms(part) / step:.3f})"

    rows = [[part if part != "head" else "  of which head", *(cell(c, part) for c in costs.values())] for part in parts]
    rows.append(["unattributed", *(cell(c, "unattributed") for c in costs.values())])
    rows.append(["**cycle**", *(f"**{c.ms('cycle'):.2f} ({c.ms('cycle') / step:.3f})**" for c in costs.values())])
    rows.append(["slots per cycle", *(f"{c.slots / c.cycles:.1f}" for c in costs.values())])
    rows.append(["TPF", *(f"{c.tpf:.2f}" for c in costs.values())])
    rows.append(["x AR predicted (TPF / cycle)", *(f"{c.tpf * step / c.ms('cycle'):.2f}" for c in costs.values())])
    rows.append(["x AR measured (decode time)", *(f"{ar.wall / c.wall:.2f}" for c in costs.values())])
    rows.append(["  95% over resampled prompts", *(_span(speedup_interval(c, ar)) for c in costs.values())])
    configs = [n for n in costs if n not in (AR_NAME, CONTROL_NAME)]
    if len(configs) > 1:  # the decision is usually against the first config
        first, one = configs[0], costs[configs[0]]
        rows.append([f"x {first} measured", *(f"{one.wall / c.wall:.2f}" for c in costs.values())])
        rows.append(["  95% over resampled prompts", *(_span(speedup_interval(c, one)) for c in costs.values())])
    return head, rows


def speedup_interval(cost: CycleCost, against: CycleCost) -> tuple[float, float] | None:
    """`against`'s decode time over `cost`'s, the central 95% over resampled prompts (the same prompts drawn for
    both); None for a method against itself or with fewer than two prompts. Both decoded the same tokens (every
    output is AR's), so the ratio of times is the ratio of tokens/s."""
    n = len(cost.prompt_walls)
    if cost is against or n < 2 or len(against.prompt_walls) != n:
        return None
    ones = [1.0] * n
    return paired_ratio_interval(ones, cost.prompt_walls, ones, against.prompt_walls)


def _span(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


def summary(costs: dict[str, CycleCost]) -> dict[str, dict]:
    """The figures as JSON: per method its description, cycles, tokens, TPF, and ms per cycle of each part."""
    step = costs[AR_NAME].ms("cycle")
    return {
        name: {
            "config": c.describe,
            "cycles": c.cycles,
            "new_tokens": c.new_tokens,
            "tpf": c.tpf,
            "slots_per_cycle": c.slots / c.cycles,
            "ms_per_cycle": {p: c.ms(p) for p in [*c.seconds, "unattributed", "cycle"]},
            "ar_steps_per_cycle": c.ms("cycle") / step,
            "speedup_vs_ar": costs[AR_NAME].wall / c.wall,
            "speedup_vs_ar_interval": speedup_interval(c, costs[AR_NAME]),
            # By who laid each slot out, then its depth: [slots laid out, slots accepted] over the whole run.
            "slots": {
                owner: {str(d): list(v) for (o, d), v in sorted(c.outcomes.items()) if o == owner}
                for owner in sorted({o for o, _ in c.outcomes})
            },
            # Each row's forwards by who won them ("none": only the known-correct token was accepted).
            "won": {owner or "none": n for owner, n in c.wins.items()},
        }
        for name, c in costs.items()
    }


def slot_cost(cost: CycleCost, ar: CycleCost) -> tuple[float, float] | None:
    """(a slot's cost in AR steps, the acceptance a slot needs to pay for it): the method's cycle over AR's, less
    the one AR step its first slot costs, per slot past the first (the mean slot: Python and the head included);
    break-even where p / TPF = c / cycle. None where the method runs one slot a cycle."""
    per_cycle = cost.slots / cost.cycles
    if per_cycle <= 1 or not ar.cycles:
        return None
    cycle = cost.ms("cycle") / ar.ms("cycle")
    c = (cycle - 1) / (per_cycle - 1)
    return c, c * cost.tpf / cycle


def slot_table(costs: dict[str, CycleCost]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per method and per who laid its slots out, the slots a cycle, the tokens they had accepted
    a cycle, the share accepted, and how many of those slots a cycle were laid at a depth whose acceptance is below
    the break-even (`slot_cost`) with the tokens they earned: what a cut of them would save and lose."""
    ar = costs[AR_NAME]
    head = ["method", "laid out by", "slots / cycle", "accepted / cycle", "accepted / slot"]
    head += ["below break-even: slots (accepted) / cycle", "forwards won"]
    rows = []
    for name, c in costs.items():
        priced = slot_cost(c, ar)
        if priced is None or not c.outcomes:
            continue
        rows.append(
            [name, f"(a slot costs {priced[0]:.3f} AR steps; pays above {priced[1]:.3f} accepted)", "", "", "", "", ""]
        )
        # Who won a row's forward decides whose picks the next one starts from: a draft chain's guesses are read
        # only where the window wins or reaches past the winner (multiblock.py `settle`).
        rows_won = sum(c.wins.values()) or 1
        for owner in sorted({o for o, _ in c.outcomes}):
            mine = {d: v for (o, d), v in c.outcomes.items() if o == owner}
            laid, accepted = (sum(v[i] for v in mine.values()) for i in (0, 1))
            low = [v for v in mine.values() if v[1] < priced[1] * v[0]]
            cut = f"{sum(v[0] for v in low) / c.cycles:.2f} ({sum(v[1] for v in low) / c.cycles:.3f})"
            won = f"{c.wins[owner] / rows_won:.0%}" if owner != DRAFT_CHAIN else "-"  # never verified: never wins
            rows.append(
                ["", owner, f"{laid / c.cycles:.2f}", f"{accepted / c.cycles:.3f}", f"{accepted / laid:.3f}", cut, won]
            )
        if c.wins[None]:
            rows.append(["", "(none: the known-correct token only)", "", "", "", "", f"{c.wins[None] / rows_won:.0%}"])
    return head, rows
