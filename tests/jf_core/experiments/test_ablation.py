"""The ablation's pure parts: the catalog as typed config, equal-compute overrides, and the table's statistics."""

from __future__ import annotations

import statistics

import pytest
from pydantic import ValidationError

from jf_core.config import JFTrainConfig, load_profile
from jf_core.experiments import ablation, variants
from jf_core.training.noise import BlocksPerAnswer, NoiseProfile, NoiseSchedule


def test_every_catalog_variant_is_a_valid_profile_override():
    for name, overrides in ablation.VARIANTS.items():
        prof = load_profile("tiny", **variants.run_overrides({"training": {"steps": 10}}, overrides, seed=2))
        assert prof.training.seed == 2 and prof.training.steps == 10, name
        # Each row is what its name says on any profile: `tiny` ships CLLM, so a JF row sets method and mask itself.
        if name != "cllm":
            assert prof.training.method == "jacobi_forcing", name
            assert prof.training.mask == ("clean_context" if "clean-context" in name else "shipped"), name
    cllm = load_profile("tiny", **ablation.VARIANTS["cllm"]).training
    assert NoiseSchedule.of(cllm).kind == "uniform_state" and cllm.mask == "clean_context"


def test_cllm_without_the_clean_context_mask_is_refused():
    with pytest.raises(ValueError, match=r"training\.mask clean_context"):
        JFTrainConfig(method="cllm")


def test_unknown_and_clashing_variants_are_named():
    with pytest.raises(ValueError, match=r"unknown variant.*'jf zigzag'"):
        ablation.AblationConfig(variants=["jf zigzag"])
    with pytest.raises(ValueError, match="reuse catalog names"):
        ablation.AblationConfig(variants=["cllm"], custom={"cllm": {}}).catalog()
    with pytest.raises(ValueError, match="seeds"):
        ablation.AblationConfig(seeds=[])


def test_run_overrides_layer_common_then_variant_then_seed():
    out = variants.run_overrides(
        {"training": {"steps": 5, "schedule": "random"}, "evaluation": {"num_prompts": 9}},
        {"training": {"schedule": "reverse"}},
        seed=4,
    )
    assert out == {"training": {"steps": 5, "schedule": "reverse", "seed": 4}, "evaluation": {"num_prompts": 9}}


def _run(variant, seed, accuracy, tpf16, tpf32, picked=0.3):
    blocks = BlocksPerAnswer(mean=4.0, p10=3, p50=4, p90=5)
    noise = NoiseProfile(
        blocks_per_answer=blocks,
        target_mean=None,
        picked_mean=picked,
        picked_above_half=picked / 2,
        picked_histogram=[],
    )
    tpf = {"16": tpf16, "32": tpf32}
    return ablation.AblationRun(
        variant=variant, seed=seed, accuracy=accuracy, tpf=tpf, multiblock_tpf=tpf16 + 1, noise=noise
    )


def test_summary_means_spreads_table_and_margin():
    runs = [_run("jf random w16", s, 0.99, 3.0 + s / 10, 4.0) for s in range(3)]
    runs += [_run("cllm", s, 0.98, 2.0 + s / 5, 2.5) for s in range(3)]
    rows = ablation.summarize(runs)
    assert [r.variant for r in rows] == ["jf random w16", "cllm"]
    jf = rows[0]
    assert jf.seeds == [0, 1, 2] and jf.tpf["16"] == pytest.approx((3.1, statistics.stdev([3.0, 3.1, 3.2])))
    assert jf.paper == ablation.PAPER["jf random w16"] and rows[1].paper is None
    base = ablation.InputFigures(accuracy=0.99, tpf={"16": 1.5, "32": 1.6})
    table = ablation.markdown(rows, base=base, multiblock="n=16 K=2")
    lines = table.splitlines()
    assert lines[0].startswith("| variant | seeds | accuracy % | TPF n=16 | TPF n=32 | TPF n=16 K=2 | iter/token n=16")
    assert lines[2].startswith("| input model | - | 99.00 | 1.50 | 1.60 | - | 0.667")
    assert "| jf random w16 | 3 | 99.00 ± 0.00 | 3.10 ± 0.10 | 4.00 ± 0.00 | 4.10 ± 0.10 | 0.323 ± 0.010" in table
    assert "83.5% / 0.51" in lines[3] and "paper: CLLM TPF 2.1-2.7" in lines[4]
    m = ablation.margin(rows, "jf random w16", "cllm", "16")
    assert m.difference == pytest.approx(0.9) and m.ratio == pytest.approx(3.1 / 2.2)
    assert m.t == pytest.approx(0.9 / ((0.1**2 / 3 + 0.2**2 / 3) ** 0.5))
    assert ablation.margin(rows, "jf random w16", "cllm", "multiblock").difference == pytest.approx(0.9)
    assert ablation.figure(rows).axes[0].get_xlabel() == "tokens per forward (TPF)"
    result = ablation.AblationResult(
        summary=rows, runs=runs, table=table, note="", input_model=base, seconds=1.0, mlflow_run_id="r",
        config=ablation.AblationConfig(variants=["cllm"]),
    )  # fmt: skip
    assert ablation.AblationResult.model_validate_json(result.model_dump_json()) == result  # `jf ablate --out`


def test_the_multiblock_decode_is_checked_and_named():
    config = ablation.AblationConfig(multiblock={"block_size": 32, "num_blocks": 3, "pool_size": 0})
    assert config.multiblock_config(64).num_blocks == 3 and config.multiblock.describe() == "n=32 K=3 pool=0"
    with pytest.raises(ValidationError, match=r"multiblock\n.*num_blocks"):  # refused where it is given, by name
        ablation.AblationConfig(multiblock={"block_size": 16, "num_blocks": 0})
