"""`jf bench cycle`: each config's cycle part by part in AR steps, every output checked against AR's."""

from __future__ import annotations

import pytest

from jf_cli.main import main
from jf_core.decoding import JFDecodeConfig
from jf_core.evaluation.cycle_cost import AR_NAME, cost_table, measure_cycles, slot_table, summary
from jf_core.evaluation.evaluate import LosslessnessError
from jf_core.models import stop_tokens

PROMPTS = ["program: a=85; step -8; return f", "program: x=9; step *2; step -1; return z"]


def _prompts(tok):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def test_cycles_in_ar_steps_for_each_config(embedded):
    model, tok = embedded
    configs = {"n16": JFDecodeConfig(block_size=16, num_blocks=1, pool_size=0), "lookup": JFDecodeConfig(lookup=8)}
    costs = measure_cycles(model, _prompts(tok), configs, max_new_tokens=32, stop=stop_tokens(model, tok))
    assert list(costs) == [AR_NAME, "n16", "lookup"]
    figures = summary(costs)
    assert figures[AR_NAME]["ar_steps_per_cycle"] == 1.0 and figures[AR_NAME]["tpf"] == 1.0
    assert figures[AR_NAME]["slots_per_cycle"] == 1.0
    assert figures["n16"]["tpf"] > 1.2 and figures["n16"]["slots_per_cycle"] > 1  # the embedded model drafts well
    for name, c in costs.items():
        assert c.new_tokens == costs[AR_NAME].new_tokens  # the same outputs, so the same tokens
        assert c.ms("unattributed") >= 0, name
    head, rows = cost_table(costs)
    assert head[0] == "part" and len(head) == 4
    assert [r[0] for r in rows][-8:] == [
        "**cycle**", "slots per cycle", "TPF", "x AR predicted (TPF / cycle)", "x AR measured (decode time)",
        "  95% over resampled prompts", "x n16 measured", "  95% over resampled prompts",
    ]  # fmt: skip
    # Each speedup's interval over resampled prompts holds the measured speedup; a method against itself has none.
    for name, c in costs.items():
        assert len(c.prompt_walls) == len(PROMPTS) and sum(c.prompt_walls) == pytest.approx(c.wall)
        interval = figures[name]["speedup_vs_ar_interval"]
        if name == AR_NAME:
            assert interval is None
        else:
            assert interval[0] <= figures[name]["speedup_vs_ar"] <= interval[1]
    spans = (figures[n]["speedup_vs_ar_interval"] for n in configs)
    assert rows[-3][1:] == ["-", *(f"{a:.2f}-{b:.2f}" for a, b in spans)]
    assert rows[-1][2] == "-"  # n16 against itself
    # What each slot earned: the lookup config's slots by who laid them out, its lookup's among them; AR runs one
    # slot a cycle and has no row.
    head, rows = slot_table(costs)
    assert head[:2] == ["method", "laid out by"] and AR_NAME not in [r[0] for r in rows]
    owners = [r[1] for r in rows[rows.index(next(r for r in rows if r[0] == "lookup")) + 1 :]]
    assert "window" in owners and "lookup" in owners
    slots = figures["lookup"]["slots"]
    laid = sum(v[0] for depths in slots.values() for v in depths.values())
    assert laid == costs["lookup"].slots - costs["lookup"].cycles  # every slot past each root, counted once


def test_a_config_whose_output_is_not_ars_is_refused(embedded, monkeypatch):
    """The check bites: a verifier that accepts one token too many decodes other text."""
    from jf_core.decoding import jacobi

    model, tok = embedded
    real = jacobi.accepted_length
    monkeypatch.setattr(jacobi, "accepted_length", lambda draft, greedy: min(len(draft), real(draft, greedy) + 1))
    with pytest.raises(LosslessnessError, match="n16"):
        measure_cycles(
            model, _prompts(tok), {"n16": JFDecodeConfig(block_size=16, num_blocks=1, pool_size=0)},
            max_new_tokens=32, stop=stop_tokens(model, tok), warmup=0,
        )  # fmt: skip


def test_jf_bench_cycle_prints_the_table_and_writes_its_json(embedded, tmp_path, capsys):
    import json

    model, _ = embedded
    out = tmp_path / "cycle.json"
    argv = ["bench", "cycle", "--model", model.name_or_path, "--num-prompts", "2", "--max-new-tokens", "24"]
    # `NAME@MODEL`: a config decoded on another model (here a second copy of the same one), in the same run.
    other = f'there@{model.name_or_path}:{{"block_size": 4}}'
    assert main([*argv, "--no-tuned", "--config", 'n8:{"block_size": 8}', "--config", other, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| part | ar: ms (AR steps) | n8: ms (AR steps) | there: ms (AR steps) |" in printed
    assert "| **cycle** |" in printed
    methods = json.loads(out.read_text())["methods"]
    assert set(methods) == {"ar", "n8", "there"} and methods["there"]["config"].startswith("n=4")
    # Who won each forward, in the JSON and as the slot table's last column: every forward counted once.
    assert sum(methods["n8"]["won"].values()) == methods["n8"]["cycles"] and methods["ar"]["won"] == {}
    assert "| below break-even: slots (accepted) / cycle | forwards won |" in printed
    with pytest.raises(SystemExit):
        main([*argv, "--config", "n8:{not json}"])
    assert "its fields are not JSON" in capsys.readouterr().err


def test_the_control_times_ar_twice_and_a_config_may_not_take_ars_name(embedded, capsys, tmp_path):
    """`control`: our AR decodes every prompt a second time as its own timed row (the timer's spread), its output
    checked like every config's; a config named as one of AR's rows is refused before anything decodes."""
    import json

    from jf_core.evaluation.cycle_cost import CONTROL_NAME

    model, tok = embedded
    configs = {"n8": JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0)}
    costs = measure_cycles(model, _prompts(tok), configs, max_new_tokens=16, stop=stop_tokens(model, tok), control=True)
    assert list(costs) == [AR_NAME, CONTROL_NAME, "n8"]
    again = costs[CONTROL_NAME]
    assert again.tpf == 1.0 and again.new_tokens == costs[AR_NAME].new_tokens and len(again.prompt_walls) == 2
    for name in (AR_NAME, CONTROL_NAME):
        with pytest.raises(ValueError, match=name):
            measure_cycles(model, _prompts(tok), {name: configs["n8"]}, max_new_tokens=16, stop=stop_tokens(model, tok))
    out = tmp_path / "cycle.json"
    argv = ["bench", "cycle", "--model", model.name_or_path, "--num-prompts", "2", "--max-new-tokens", "16"]
    assert main([*argv, "--no-tuned", "--config", 'n8:{"block_size": 8}', "--control", "--json", str(out)]) == 0
    spread = json.loads(out.read_text())["timing_spread"]
    assert f"timing spread (AR against AR in this run): {spread:.3f}" in capsys.readouterr().out
