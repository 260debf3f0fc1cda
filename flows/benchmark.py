"""Flow `jf-benchmark`: accuracy and speed of one registered model on the profile's evaluation, as an MLflow run
and a Prefect summary; with a `models:/<name>/<version>` URI the version gets a `jf.benchmark` tag pointing at it.

prefect.yaml's `jf-benchmark/champion` runs it on every `jf.model.champion-changed` event (tasks/events.py), so a
new champion is benchmarked without anyone asking; `prefect deployment run jf-benchmark/champion` runs it by hand.
"""

from __future__ import annotations

import json
import re

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from jacobi_forcing.flows.round import load
from jacobi_forcing.tasks import mlflow_runs, round_tasks
from jacobi_forcing.tasks.reporting import artifact_key, markdown_table
from jf_core.config import ProfileOverrides

VERSION_URI = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)$")


@flow(name="jf-benchmark", flow_run_name="jf-benchmark-{profile}", log_prints=True, validate_parameters=True)
def jf_benchmark(
    profile: str = "tiny", overrides: ProfileOverrides | None = None, model: str = "models:/jf-tiny@champion"
) -> dict:
    prof = load(profile, overrides)
    logger = get_run_logger()
    path = round_tasks.resolve_model(model, prof)
    result = round_tasks.evaluate(prof, path, f"benchmark of {model}")
    metrics = result.metrics()
    client, experiment = mlflow_runs.connect(prof)
    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "jf.profile": prof.name, "jf.benchmarked_model": model}
    with mlflow_runs.mlflow_run(
        client, experiment, f"benchmark {model}", profile=prof, tags=tags, logger=logger
    ) as run_id:
        for k, v in metrics.items():
            client.log_metric(run_id, k, float(v))
        client.log_dict(run_id, result.model_dump(mode="json"), "eval/benchmark.json")
    if (m := VERSION_URI.match(model)) is not None:
        summary = {"mlflow_run_id": run_id, **{k: round(float(v), 4) for k, v in metrics.items()}}
        client.set_model_version_tag(m["name"], m["version"], "jf.benchmark", json.dumps(summary))
    rows = [{"metric": k, "value": f"{v:.4g}"} for k, v in metrics.items()]
    create_markdown_artifact(
        f"# Benchmark of `{model}`\n\n{markdown_table(rows)}\n",
        key=artifact_key("jf-benchmark", prof.name),
        description=f"benchmark of {model}",
    )
    logger.info("benchmark of %s: %s", model, json.dumps({k: round(float(v), 4) for k, v in metrics.items()}))
    return {"model": model, "path": path, "mlflow_run_id": run_id, **metrics}
