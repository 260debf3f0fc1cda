"""An experiment's rows in MLflow (tasks/experiment_runs.py), in a real store."""

from __future__ import annotations


def test_experiment_rows_go_to_mlflow_with_the_curve_by_step(profile, tmp_path, monkeypatch):
    """`--mlflow` (or `--from-json FILE --mlflow` for rows a GPU machine wrote): a run per row in a real MLflow
    store, its figures as metrics, its probes as a curve by step with the packed tokens at each, the plot attached."""
    from mlflow.tracking import MlflowClient

    from jacobi_forcing.tasks.experiment_runs import log_experiment

    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = profile.model_copy(update={"registry": profile.registry.model_copy(update={"tracking_uri": uri})})
    figures = {"tpf": 1.3, "identical_to_own_ar": 1.0, "identical_to_base": 0.5, "repetition": 0.2, "mean_length": 9}
    history = [{"step": 0.0, "loss": 3.0}, {"step": 1.0, "probe_tpf_n16": 1.1}, {"step": 3.0, "probe_tpf_n16": 1.4}]
    row = {"variant": "both", "overrides": {"training": {"mask": "clean_context"}}, "trained": figures,
           "held_out": figures, "train_seconds": 5.0, "train_tokens": 4000, "history": history}  # fmt: skip
    plot = tmp_path / "curve.png"
    plot.write_bytes(b"png")
    (run_id,) = log_experiment(p, [row], plot, source="test")
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["jf.kind"] == "experiment"
    assert run.data.params["training.mask"] == '"clean_context"' and run.data.metrics["held_out.tpf"] == 1.3
    curve = client.get_metric_history(run_id, "probe_tpf_n16")
    assert [(m.step, m.value) for m in curve] == [(1, 1.1), (3, 1.4)]
    assert [m.value for m in client.get_metric_history(run_id, "probe_tokens")] == [2000.0, 4000.0]
    assert [a.path for a in client.list_artifacts(run_id)] == ["curve.png"]
