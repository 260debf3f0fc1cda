"""The promotion gate: may a round's model become the registry's `champion`?

Two conditions, each reported with its reason: the accuracy may not drop more than `max_accuracy_drop` below the
round's input model (measured in the same evaluation), and the headline TPF may not fall below the current
champion's (a first champion passes that check by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jf_core.config import GateConfig


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: list[str] = field(default_factory=list)


def decide(
    *, accuracy: float, input_accuracy: float, tpf: float, champion_tpf: float | None, cfg: GateConfig
) -> GateDecision:
    reasons, passed = [], True
    drop = input_accuracy - accuracy
    if drop > cfg.max_accuracy_drop + 1e-12:
        passed = False
        reasons.append(
            f"accuracy dropped {drop:.4f} (> {cfg.max_accuracy_drop}) from the input model's {input_accuracy:.4f}"
        )
    else:
        reasons.append(f"accuracy drop {drop:.4f} within {cfg.max_accuracy_drop}")
    if cfg.tpf_not_below_champion and champion_tpf is not None:
        if tpf < champion_tpf:
            passed = False
            reasons.append(f"TPF {tpf:.3f} below the champion's {champion_tpf:.3f}")
        else:
            reasons.append(f"TPF {tpf:.3f} not below the champion's {champion_tpf:.3f}")
    elif cfg.tpf_not_below_champion:
        reasons.append("no champion yet: TPF check passes")
    return GateDecision(passed, reasons)
