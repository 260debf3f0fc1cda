"""What a round records in MLflow, without noise in the user's terminal."""

from __future__ import annotations

import json
import warnings
from pathlib import Path


def test_the_trajectory_input_is_logged_without_mlflows_ambiguous_source_warning(tmp_path):
    from mlflow import MlflowClient

    from jacobi_forcing.tasks.mlflow_runs import log_trajectory_input

    store = tmp_path / "trajectories"
    store.mkdir()
    (store / "manifest.json").write_text('{"shards": {}}')
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e", artifact_location=str(tmp_path / "art"))).info.run_id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_trajectory_input(client, run_id, tmp_path / "gone", store)
    assert not [w for w in caught if "interpreted in multiple ways" in str(w.message)]
    (dataset,) = client.get_run(run_id).inputs.dataset_inputs
    assert dataset.dataset.name == "trajectories" and dataset.dataset.source_type == "local"


def _store(tmp_path):
    from mlflow import MlflowClient

    from jf_core.config import RegistryConfig, load_profile

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    profile = load_profile("tiny").model_copy(update={"registry": RegistryConfig(tracking_uri=uri)})
    return client, experiment, profile


def test_a_run_is_closed_finished_or_failed_by_how_its_block_ends(tmp_path):
    import pytest

    from jacobi_forcing.tasks.mlflow_runs import mlflow_run

    client, experiment, profile = _store(tmp_path)
    with mlflow_run(client, experiment, "ok", profile=profile, tags={"k": "v"}) as ok:
        assert client.get_run(ok).info.status == "RUNNING"
    assert client.get_run(ok).info.status == "FINISHED" and client.get_run(ok).data.tags["k"] == "v"
    for error in (ValueError("a stage failed"), KeyboardInterrupt()):  # a crash, and a cancellation or SIGTERM
        with pytest.raises(type(error)), mlflow_run(client, experiment, "bad", profile=profile) as bad:
            raise error
        assert client.get_run(bad).info.status == "FAILED"
    with mlflow_run(client, experiment, "parent", profile=profile) as parent:
        with pytest.raises(ValueError), mlflow_run(client, experiment, "child", profile=profile, parent=parent):
            raise ValueError
        with mlflow_run(client, experiment, "adopted", profile=profile, adopt=parent) as adopted:
            assert adopted == parent
        assert client.get_run(parent).info.status == "RUNNING"  # an adopted run is its owner's to close
    assert client.get_run(parent).info.status == "FINISHED"


def test_a_store_that_cannot_close_the_run_never_hides_the_blocks_error(tmp_path, caplog):
    """The block's own error comes out; the run is left for the next round's reaper, and the log says so."""
    import logging

    import pytest

    from jacobi_forcing.tasks.mlflow_runs import mlflow_run
    from jf_core.config import RegistryConfig

    client, experiment, profile = _store(tmp_path)
    gone = profile.model_copy(update={"registry": RegistryConfig(tracking_uri="http://127.0.0.1:9")})  # discard port
    with (
        caplog.at_level(logging.WARNING, logger="jf.mlflow"),
        pytest.raises(ValueError, match="the stage's own error"),
        mlflow_run(client, experiment, "r", profile=gone) as run_id,
    ):
        raise ValueError("the stage's own error")
    assert client.get_run(run_id).info.status == "RUNNING"
    assert "could not close MLflow run" in caplog.text and "reaper" in caplog.text


def test_a_round_is_logged_from_its_report_and_its_figures_closed(tmp_path):
    """`log_round`: the report's metrics and params, its plots, the report as report.json holds it (less the loss
    curve, which is metrics per step), and the trajectory input; pyplot keeps no figure of it after."""
    import matplotlib.pyplot as plt

    from jacobi_forcing.tasks.mlflow_runs import log_round
    from jf_core.round.figures import round_figures
    from tests.reports import TRAJECTORIES, evaluation, round_report

    store = tmp_path / "trajectories"
    store.mkdir()
    (store / "manifest.json").write_text('{"shards": {}}')
    tps = {"ar": 500.0, "jacobi_n16": 900.0}
    jf, base = evaluation({16: 3.0}, tps), evaluation({16: 1.3}, tps)
    report = round_report(
        jf, base, trajectories=TRAJECTORIES.model_copy(update={"out": str(store)}), round_dir=str(tmp_path)
    )
    client, experiment, _ = _store(tmp_path)
    run_id = client.create_run(experiment).info.run_id
    plt.close("all")
    log_round(client, run_id, report, round_figures(report))
    assert plt.get_fignums() == []
    run = client.get_run(run_id)
    assert run.data.metrics["tpf_n16"] == 3.0 and run.data.metrics["base_tpf_n16"] == 1.3
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 10]
    assert run.data.params["threads.train_policy"] == "fixed"
    assert run.data.params["train.compute_dtype"] == "bfloat16"  # what training ran in (`auto` resolves it)
    logged = json.loads(Path(client.download_artifacts(run_id, "eval/report.json", str(tmp_path))).read_text())
    assert logged["eval"]["methods"]["jacobi_n16"]["tpf"] == 3.0 and "history" not in logged["train"]
    assert {a.path for a in client.list_artifacts(run_id, "plots")} == {
        "plots/loss_curves.png", "plots/tpf_per_round.png", "plots/acceptance_histogram.png"
    }  # fmt: skip
