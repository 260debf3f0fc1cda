"""What a round records in MLflow, without noise in the user's terminal."""

from __future__ import annotations

import warnings


def test_the_trajectory_input_is_logged_without_mlflows_ambiguous_source_warning(tmp_path):
    from mlflow import MlflowClient

    from jacobi_forcing.tasks.tracking import log_trajectory_input

    store = tmp_path / "trajectories"
    store.mkdir()
    (store / "manifest.json").write_text('{"shards": {}}')
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e", artifact_location=str(tmp_path / "art"))).info.run_id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_trajectory_input(client, run_id, store, {"trajectories": {"out": str(store)}})
    assert not [w for w in caught if "interpreted in multiple ways" in str(w.message)]
    (dataset,) = client.get_run(run_id).inputs.dataset_inputs
    assert dataset.dataset.name == "trajectories" and dataset.dataset.source_type == "local"
