"""The training history's probes (jf_core/training/history.py): a probe's name in a history row is made from the probe
and read back to the same probe; nothing else in a row is taken for one."""

from __future__ import annotations

from jf_core.training.history import TpfProbe, tpf_probes


def test_a_probes_key_reads_back_to_the_probe_and_no_other_figure_does():
    assert TpfProbe(16).key == "probe_tpf_n16" and TpfProbe(16).label == "n16"
    assert TpfProbe.of_key(TpfProbe(128).key) == TpfProbe(128)
    for other in ("loss", "step", "probe_tpf_n", "probe_tpf_n16x", "xprobe_tpf_n16", "probe_tokens"):
        assert TpfProbe.of_key(other) is None, other


def test_a_historys_probes_by_block_size_with_their_points():
    history = [
        {"step": 0.0, "loss": 3.0},
        {"step": 1.0, "loss": 2.5, "probe_tpf_n32": 1.2, "probe_tpf_n8": 1.1},
        {"step": 3.0, "probe_tpf_n8": 1.4},
    ]
    assert tpf_probes(history) == [TpfProbe(8), TpfProbe(32)]
    assert TpfProbe(8).points(history) == [(1, 1.1), (3, 1.4)]
    assert TpfProbe(32).points(history) == [(1, 1.2)]
    assert tpf_probes([{"step": 0.0, "loss": 1.0}]) == []
