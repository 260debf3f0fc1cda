"""What a round records in MLflow, without noise in the user's terminal."""

from __future__ import annotations

import warnings


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
