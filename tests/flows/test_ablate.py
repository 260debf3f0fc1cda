"""`jf-ablate` on a real Prefect server and MLflow store: variants x seeds at equal compute share one trajectory
store where their trajectory config agrees and collect their own where it does not, every run is a child of one
MLflow parent that holds the table, the runs and the plot, and a bad or unequal variant is refused before any
work."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from jf_core.experiments.ablation import AblationConfig

pytestmark = pytest.mark.timeout(900)

SMALL = {"evaluation": {"block_sizes": [4, 8], "num_prompts": 4, "max_new_tokens": 24, "batch_size": 4}}


def test_ablation_runs_variants_and_seeds_under_one_parent(prefect_server, jf_env):
    from jacobi_forcing.flows.ablate import jf_ablate

    config = AblationConfig(
        variants=["cllm"],
        custom={
            "jf random w2": {"training": {"schedule": "random", "window": 2}},
            "jf random w2 uniform-vocab drafts": {
                "training": {"schedule": "random", "window": 2}, "trajectory": {"draft_init": "random_vocab"},
            },
        },
        seeds=[0, 1],
    )  # fmt: skip
    result = jf_ablate(jf_env["profile"], ablation_config=config, overrides=SMALL)

    assert [r.variant for r in result.summary] == ["cllm", "jf random w2", "jf random w2 uniform-vocab drafts"]
    assert all(r.seeds == [0, 1] and set(r.tpf) == {"4", "8"} for r in result.summary)
    assert all(r.multiblock_tpf >= 1.0 for r in result.runs)  # every model also decoded with K=2 blocks
    runs = result.runs
    assert len({r.round_dir for r in runs}) == 6  # every (variant, seed) trained on its own
    stores = {r.variant: _store(r.round_dir) for r in runs}
    assert stores["jf random w2"] == stores["cllm"] != stores["jf random w2 uniform-vocab drafts"]
    assert {_store(r.round_dir) for r in runs} == set(stores.values())  # seeds share their variant's store
    cllm = [r for r in runs if r.variant == "cllm"]
    assert all(r.noise.target_mean is None for r in cllm)
    assert all(r.noise.target_mean is not None for r in runs if r.variant != "cllm")
    assert "| jf random w2 | 2 |" in result.table and "| input model |" in result.table

    client = MlflowClient(jf_env["tracking_uri"], jf_env["tracking_uri"])
    parent = client.get_run(result.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["jf.kind"] == "ablation"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "ablation")}
    assert artifacts == {"ablation/config.json", "ablation/table.md", "ablation/results.json"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "plots")] == ["plots/ablation.png"]
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert sorted((c.data.tags["jf.variant"], c.data.tags["jf.seed"]) for c in children) == sorted(
        (r.variant, str(r.seed)) for r in runs
    )
    for child in children:
        assert {"accuracy", "tpf_n4", "tpf_n8", "tpf_multiblock", "picked_noise_mean"} <= set(child.data.metrics)
        assert child.data.params["training.seed"] == child.data.tags["jf.seed"]

    again = jf_ablate(jf_env["profile"], ablation_config=config, overrides=SMALL)  # every stage reused
    assert [r.tpf for r in again.runs] == [r.tpf for r in runs]
    assert again.summary == result.summary


def _store(round_dir: str) -> str:
    return str((Path(round_dir) / "trajectories").resolve())


@pytest.mark.parametrize(
    ("custom", "error"),
    [
        (
            {"zigzag": {"training": {"schedule": "zigzag"}}},
            r"(?s)ablation variant 'zigzag': profile .*training\.schedule",
        ),
        ({"longer": {"training": {"steps": 99}}}, "ablation variant 'longer' changes training.steps"),
        ({"fewer prompts": {"prompts": {"limit": 3}}}, "ablation variant 'fewer prompts' changes prompts"),
    ],
)
def test_a_bad_or_unequal_variant_is_refused_before_any_work(prefect_server, jf_env, custom, error):
    from jacobi_forcing.flows.ablate import jf_ablate

    config = AblationConfig(variants=["cllm"], custom=custom, seeds=[0])
    with pytest.raises(ValueError, match=error):
        jf_ablate(jf_env["profile"], ablation_config=config, overrides=SMALL)
    assert not (jf_env["tmp"] / "runs").exists()  # nothing collected, trained or evaluated
    client = MlflowClient(jf_env["tracking_uri"], jf_env["tracking_uri"])
    assert not client.search_experiments() or not client.search_runs(
        [e.experiment_id for e in client.search_experiments()]
    )
