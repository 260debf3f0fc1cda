"""The promotion gate's two conditions, each with its reason."""

from __future__ import annotations

from jf_core.config import GateConfig
from jf_core.evaluation.gate import decide


def test_first_champion_needs_only_accuracy():
    d = decide(accuracy=0.98, input_accuracy=1.0, tpf=3.0, champion_tpf=None, cfg=GateConfig(max_accuracy_drop=0.03))
    assert d.passed and any("no champion" in r for r in d.reasons)


def test_accuracy_drop_beyond_epsilon_fails():
    d = decide(accuracy=0.96, input_accuracy=1.0, tpf=3.0, champion_tpf=None, cfg=GateConfig(max_accuracy_drop=0.03))
    assert not d.passed and "dropped 0.0400" in d.reasons[0]


def test_tpf_below_champion_fails_unless_disabled():
    cfg = GateConfig(max_accuracy_drop=0.03)
    assert not decide(accuracy=1.0, input_accuracy=1.0, tpf=2.9, champion_tpf=3.0, cfg=cfg).passed
    assert decide(accuracy=1.0, input_accuracy=1.0, tpf=3.0, champion_tpf=3.0, cfg=cfg).passed
    off = GateConfig(max_accuracy_drop=0.03, tpf_not_below_champion=False)
    assert decide(accuracy=1.0, input_accuracy=1.0, tpf=2.0, champion_tpf=3.0, cfg=off).passed


def test_negative_epsilon_demands_an_improvement():
    cfg = GateConfig(max_accuracy_drop=-1.0)
    assert not decide(accuracy=1.0, input_accuracy=1.0, tpf=9.0, champion_tpf=None, cfg=cfg).passed
