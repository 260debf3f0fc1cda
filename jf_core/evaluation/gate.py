"""The promotion gate: may a round's model become the registry's `champion`?

Rounds run unattended and consumers load `@champion` without looking, so the gate has to hold against slow drift
and against a model that games the speed figure. Every check is a `Check` (name, value, verdict, reason), and the
model is promoted only when all pass:

1. `accuracy_vs_input`: accuracy may drop at most `max_accuracy_drop` below the round's input model;
2. `accuracy_vs_base`: and at most `max_base_accuracy_drop` below the lineage's original base model, so drops
   within tolerance cannot compound over rounds;
3. `tpf_vs_champion`: TPF may not fall below the champion's, compared only where the two were measured alike: the
   same evaluation (`eval_key`), plain Jacobi at each block size both were measured at, and the headline TPF when
   the decode configs are identical. TPF grows with the block size, so a figure at a larger n proves nothing; with
   nothing comparable the check fails;
4. `speed_vs_ar`: the headline's tokens/s over our AR's on the same model, measured taking turns in the same
   evaluation, at least `min_speedup_vs_ar`: a tuned model's headline is its dispatched decoding (AR where AR was
   measured faster), so a model that makes its consumers slower than plain AR is not promoted, however high its TPF
   (on a CPU, TPF 1.3 in a window that costs 1.7 steps is 0.6x AR);
5. `speed_vs_untrained`: the headline's tokens/s over the best untrained anchor's (the input model decoded by HF
   prompt lookup or by our decoder tuned on it, timed in the same evaluation), more than 1 + the timing's spread:
   the larger of `untrained_margin` and the widest |x - 1| of the run's AR-against-AR pairs (`timing_spread`);
   and, where the rows kept their batches, with the lower end of its 95% interval over resampled prompts
   (`untrained_low`, speed.py `ratio_interval`) above 1: the control bounds the timer, this the prompts drawn (12
   questions moved one ratio from 1.12x to 1.25x, 2026-12-06). Training that a user could skip for the same speed
   is not promoted;
6. `repetition`, `length`, `truncated`: the outputs may not turn degenerate against the input model's (repeated
   n-grams, mean length, outputs cut at `max_new_tokens`; see degeneracy.py), the ways a model inflates its TPF
   without being faster at being right.

All figures come from evaluations on the same set in the same round (or, for the champion, on an evaluation with
the same key), so the comparison is of models, not of measurements.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from jf_core.config import GateConfig

if TYPE_CHECKING:
    from jf_core.decoding import JacobiConfig
    from jf_core.evaluation.results import Evaluation


def decode_key(config: JacobiConfig) -> str:
    """A short key of a decode config: the headline TPF is comparable only between identical configs."""
    return hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Figures:
    """What the gate reads of one model's evaluation."""

    accuracy: float
    tpf: dict[str, float]  # plain Jacobi's TPF per block size
    headline_tpf: float
    decode_key: str  # of the headline decode config
    eval_key: str  # the evaluation these were measured in (set, prompts, dtype, lengths)
    output: dict[str, float] = field(default_factory=dict)  # degeneracy.output_stats of the headline's outputs
    speedup_vs_ar: float | None = None  # the headline's tokens/s over our AR's (None: figures recorded before it)
    speedup_vs_untrained: float | None = None  # over the best untrained anchor's (None: no anchor ran)
    best_untrained: str | None = None  # that anchor's row
    timing_spread: float | None = None  # the widest |x - 1| of its AR-against-AR pairs (None: no control ran)
    # The lower end of `speedup_vs_untrained`'s 95% interval over resampled prompts (None: not known, e.g. figures
    # recorded before rows kept their batches).
    untrained_low: float | None = None

    @classmethod
    def of(cls, evaluation: Evaluation, eval_key: str) -> Figures:
        versus = evaluation.versus()
        return cls(
            accuracy=evaluation.accuracy,
            tpf=evaluation.tpf,
            headline_tpf=evaluation.headline.tpf,
            decode_key=decode_key(evaluation.decode_config),
            eval_key=eval_key,
            output=dict(evaluation.headline.output_stats),
            speedup_vs_ar=evaluation.headline.speedup_vs_ar,
            speedup_vs_untrained=versus.speedup,
            best_untrained=versus.best.name if versus.best is not None else None,
            timing_spread=evaluation.timing_spread,
            untrained_low=None if (interval := versus.interval) is None else interval[0],
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Figures:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    value: float | None  # what was compared (a drop, a margin, a ratio), for plots and metrics
    reason: str


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @classmethod
    def of(cls, checks: list[Check]) -> GateDecision:
        return cls(all(c.passed for c in checks), [c.reason for c in checks], checks)


def decide(
    candidate: Figures, *, input_model: Figures, base_model: Figures, champion: Figures | None, cfg: GateConfig
) -> GateDecision:
    """Every check of the module docstring, in that order."""
    return GateDecision.of(
        [
            _accuracy("accuracy_vs_input", candidate, input_model, cfg.max_accuracy_drop, "the input model's"),
            _accuracy(
                "accuracy_vs_base", candidate, base_model, cfg.max_base_accuracy_drop, "the lineage base model's"
            ),
            *([_tpf(candidate, champion)] if cfg.tpf_not_below_champion else []),
            *([_speed(candidate, cfg.min_speedup_vs_ar)] if cfg.min_speedup_vs_ar is not None else []),
            *([_untrained(candidate, cfg.untrained_margin)] if cfg.untrained_margin is not None else []),
            *_degeneracy(candidate, input_model, cfg),
        ]
    )


def _accuracy(name: str, candidate: Figures, other: Figures, tolerance: float, whose: str) -> Check:
    drop = other.accuracy - candidate.accuracy
    if drop > tolerance + 1e-12:
        return Check(
            name, False, drop, f"accuracy dropped {drop:.4f} (> {tolerance}) from {whose} {other.accuracy:.4f}"
        )
    return Check(name, True, drop, f"accuracy drop {drop:.4f} from {whose} {other.accuracy:.4f} within {tolerance}")


def _tpf(candidate: Figures, champion: Figures | None) -> Check:
    name = "tpf_vs_champion"
    if champion is None:
        return Check(name, True, None, "no champion yet: TPF check passes")
    if champion.eval_key != candidate.eval_key:
        return Check(name, False, None, "the champion's TPF was measured on another evaluation: nothing to compare")
    pairs = {f"n={n}": (candidate.tpf[n], champion.tpf[n]) for n in sorted(candidate.tpf, key=int) if n in champion.tpf}
    if candidate.decode_key == champion.decode_key:
        pairs["headline config"] = (candidate.headline_tpf, champion.headline_tpf)
    if not pairs:
        return Check(
            name,
            False,
            None,
            f"no TPF at a block size or decode config the champion was measured at "
            f"(champion: n in {sorted(champion.tpf, key=int)}; this model: n in {sorted(candidate.tpf, key=int)})",
        )
    margin = min(ours - theirs for ours, theirs in pairs.values())
    shown = ", ".join(f"{where} {ours:.3f} vs {theirs:.3f}" for where, (ours, theirs) in pairs.items())
    if margin < 0:
        return Check(name, False, margin, f"TPF below the champion's at the same block size/config ({shown})")
    return Check(name, True, margin, f"TPF not below the champion's at the same block size/config ({shown})")


def _speed(candidate: Figures, floor: float) -> Check:
    name, x = "speed_vs_ar", candidate.speedup_vs_ar
    if x is None or x != x:  # NaN: AR did not run
        return Check(name, False, None, "the headline's speed against our AR was not measured: re-evaluate")
    if x < floor - 1e-12:
        return Check(name, False, x, f"decoding at {x:.2f}x our AR is slower than AR (floor {floor}): tune the model "
                     "so that its dispatch runs AR where no width pays")  # fmt: skip
    return Check(name, True, x, f"decoding at {x:.2f}x our AR (floor {floor})")


def _untrained(candidate: Figures, margin: float) -> Check:
    name, x = "speed_vs_untrained", candidate.speedup_vs_untrained
    if x is None or x != x:
        missing = (
            "the best untrained decoding was not measured beside this model: evaluate with evaluation.untrained on "
            "(a round does), or set registry.gate.untrained_margin: null"
        )
        return Check(name, False, None, missing)
    spread = max(margin, candidate.timing_spread or 0.0)
    how = f"spread {spread:.3f}: the larger of the floor {margin} and the run's AR-against-AR pairs"
    said = f"decoding at {x:.2f}x the best untrained decoding ({candidate.best_untrained})"
    if x <= 1.0 + spread + 1e-12:
        return Check(name, False, x, f"{said} is not faster beyond the timing's {how}: training does not pay yet")
    low = candidate.untrained_low
    if low is not None and low <= 1.0:
        return Check(name, False, x, f"{said}, beyond the timing's {how}, but over resampled prompts as low as "
                     f"{low:.2f}x (95%): too few prompts say training pays")  # fmt: skip
    over = "" if low is None else f"; at least {low:.2f}x over resampled prompts (95%)"
    return Check(name, True, x, f"{said}, beyond the timing's {how}{over}")


def _degeneracy(candidate: Figures, input_model: Figures, cfg: GateConfig) -> list[Check]:
    ours, theirs = candidate.output, input_model.output
    missing = [k for k in ("repetition", "mean_length", "truncated") if k not in ours or k not in theirs]
    if missing:
        return [Check("degeneracy", False, None, f"output figures {missing} were not measured: re-evaluate")]
    checks = []
    rep = ours["repetition"] - theirs["repetition"]
    checks.append(
        Check(
            "repetition",
            rep <= cfg.max_repetition_increase + 1e-12,
            rep,
            f"repeated n-grams {ours['repetition']:.3f} vs the input model's {theirs['repetition']:.3f} "
            f"({'within' if rep <= cfg.max_repetition_increase + 1e-12 else 'beyond'} +{cfg.max_repetition_increase})",
        )
    )
    if theirs["mean_length"] > 0:
        change = ours["mean_length"] / theirs["mean_length"] - 1
        ok = abs(change) <= cfg.max_length_change + 1e-12
        checks.append(
            Check(
                "length",
                ok,
                change,
                f"mean output length {ours['mean_length']:.1f} vs the input model's {theirs['mean_length']:.1f} "
                f"({change:+.1%}, {'within' if ok else 'beyond'} ±{cfg.max_length_change:.0%})",
            )
        )
    cut = ours["truncated"] - theirs["truncated"]
    ok = cut <= cfg.max_truncated_increase + 1e-12
    checks.append(
        Check(
            "truncated",
            ok,
            cut,
            f"outputs hitting max_new_tokens {ours['truncated']:.3f} vs the input model's {theirs['truncated']:.3f} "
            f"({'within' if ok else 'beyond'} +{cfg.max_truncated_increase})",
        )
    )
    return checks
