"""`jf-round` in process on a real Prefect server and MLflow store: a round registers a champion; the same
parameters again reuse every stage (their task runs end `Reused`); a gate made to fail leaves the champion alone;
the champion loads from the registry and decodes like the model's own greedy AR. Meanwhile nothing the flow starts
(its Ray, the temporary Prefect server, as in `jf run`) listens beyond 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from jf_core.decoding.common import StopTokens
from jf_core.model_dir import read_block
from jf_core.round.report import RoundReport
from tests.infra.sockets import SocketWatch

pytestmark = pytest.mark.timeout(900)


def _task_states(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), task_run_filter=TaskRunFilter()
            )
            return {r.name: r.state.name for r in runs}

    return asyncio.run(read())


def _flow_run_name(flow_run_id) -> str:
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return (await client.read_flow_run(flow_run_id)).name

    return asyncio.run(read())


def _champion_events() -> list[dict]:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    from jacobi_forcing.tasks.events import CHAMPION_CHANGED

    deadline = time.monotonic() + 60  # events are sent in the background and persisted in batches
    with get_client(sync_client=True) as client:
        while True:
            # limit: the client's default (100) is above what the server accepts (50)
            page = client.read_events(EventFilter(event=EventNameFilter(name=[CHAMPION_CHANGED])), limit=50)
            if page.events or time.monotonic() > deadline:
                return [e.payload for e in page.events]
            time.sleep(2)


def test_round_registers_reuses_and_gates(prefect_server, jf_env):
    from jacobi_forcing.flows.round import jf_round

    # The trajectories on the Ray actor pool, as on more than one CPU (`auto` makes them in one process under the
    # suite's JF_CPUS=1): the round's own Ray, started and watched; compute is not part of the round's key.
    on_ray = {"compute": {"trajectory_pool": "ray"}}
    with SocketWatch(os.getpid(), every=0.5) as watch:
        first = jf_round(jf_env["profile"], overrides=on_ray, return_state=True)
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in watch.seen}, watch.seen  # the round's own Ray
    assert watch.exposed() == [], watch.exposed()
    summary = first.result()
    assert summary.registry.version == "1" and summary.registry.gate_passed
    client = MlflowClient(jf_env["tracking_uri"], jf_env["tracking_uri"])
    champion = client.get_model_version_by_alias("jf-test", "champion")
    assert str(champion.version) == "1" and float(champion.tags["tpf"]) == pytest.approx(summary.headline_tpf, abs=1e-3)
    report = RoundReport.load(Path(summary.round_dir) / "report.json")  # the summary's figures are the report's
    registered = {"registry", "mlflow_run_id", "mlflow_url"}
    assert summary.model_dump(exclude=registered) == report.summary().model_dump(exclude=registered)
    assert report.headline.tpf == summary.headline_tpf
    # Where the round's time went: every stage that ran, timed (this profile does not tune).
    assert list(summary.stage_seconds) == ["trajectories", "pack", "train", "evaluate_input", "evaluate"]
    assert all(s > 0 for s in summary.stage_seconds.values()), summary.stage_seconds
    assert champion.tags["train_block_size"] == str(report.block_size)
    assert champion.tags["decode_block_size"] == str(report.eval.decode_config.block_size)
    run = client.get_run(summary.mlflow_run_id)
    for key in ("accuracy", "tpf", "tps", "speedup_vs_ar", "loss", "tpf_n4", "tpf_n8", "stage_seconds_train"):
        assert key in run.data.metrics, key
    # The trained model against its input model's untrained decoding, timed in its evaluation (this profile does
    # not tune, so HF prompt lookup is the one anchor), and the run's AR-against-AR control.
    assert report.eval.best_untrained.name == summary.best_untrained == "base_hf_prompt_lookup"
    assert run.data.metrics["speedup_vs_untrained"] == pytest.approx(summary.speedup_vs_untrained)
    assert run.data.metrics["timing_spread"] == pytest.approx(summary.timing_spread)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 2]  # logged steps
    assert "mlflow.parentRunId" in run.data.tags
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/loss_curves.png", "plots/tpf_per_round.png", "plots/acceptance_histogram.png"}
    assert run.inputs.dataset_inputs and run.inputs.dataset_inputs[0].dataset.name == "trajectories"
    # Every gate check is on the version and in the run; the model knows its lineage.
    assert {k for k in champion.tags if k.startswith("gate.")} == {
        f"gate.{c}"
        for c in (
            "accuracy_vs_input",
            "accuracy_vs_base",
            "tpf_vs_champion",
            "speed_vs_ar",
            "repetition",
            "length",
            "truncated",
        )
    }
    assert "gate_accuracy_vs_base" in run.data.metrics and "output_repetition" in run.data.metrics
    assert read_block(summary.model)["lineage"] == {"base": summary.model_in, "rounds": 1}
    # The alias moved, so the registering task announced it (prefect.yaml's jf-benchmark/champion runs on this).
    assert _champion_events() == [{"model": "jf-test", "version": "1", "uri": "models:/jf-test/1"}]

    # Evaluated in one pass at one block size, the input model's evaluation is read from the trained model's.
    gate_fails = {
        "registry": {
            "tracking_uri": jf_env["tracking_uri"],
            "model_name": "jf-test",
            "gate": {"max_accuracy_drop": -1.0},
        },
        "evaluation": {"block_sizes": [8], "speed_prompts": 6, "batch_size": 1},
    }
    second = jf_round(jf_env["profile"], overrides=gate_fails, return_state=True)
    again = second.result()
    states = _task_states(second.state_details.flow_run_id)
    for stage in ("trajectories", "pack", "train"):
        assert any(name.startswith(stage) and state == "Reused" for name, state in states.items()), states
    assert states["the input model, from the trained model's evaluation"] == "Completed", states
    assert "evaluate input model" not in states and "evaluate_input" not in again.stage_seconds
    read = RoundReport.load(Path(again.round_dir) / "report.json").base_eval
    assert read.model == summary.model_in and set(read.methods) == {"ar", "jacobi_n8"}
    assert again.round_dir == summary.round_dir
    assert (again.registry.version, again.registry.gate_passed) == ("2", False)
    assert str(client.get_model_version_by_alias("jf-test", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("jf-test", "challenger").version) == "2"
    # A fully cached re-run of the first round registers nothing new and moves no alias.
    third = jf_round(jf_env["profile"]).registry
    assert third.version == "1" and third.gate_passed
    assert len(client.search_model_versions("name='jf-test'")) == 2
    assert str(client.get_model_version_by_alias("jf-test", "challenger").version) == "2"
    assert str(client.get_model_version_by_alias("jf-test", "champion").version) == "1"
    # Runs are named by profile, block size and a key of their parameters: other overrides, another key.
    names = [_flow_run_name(state.state_details.flow_run_id) for state in (first, second)]
    assert all(re.fullmatch(r"jf-round-test-n8-[0-9a-f]{6}", name) for name in names), names
    assert names[0] != names[1]

    # A round from the champion: its input is the registry's copy; the gate holds it to the chain's original base
    # (evaluated in this round's evaluation, reused from the first round's) and to the champion's recorded figures.
    # It is the round a `jf.prompts.added` event starts: new prompts merged into the profile's.
    new = jf_env["tmp"] / "added.jsonl"
    new.write_text("".join(json.dumps({"prompt": f"program: a={i}; step +2; return a"}) + "\n" for i in range(4)))
    state = jf_round(jf_env["profile"], model="models:/jf-test@champion", new_prompts=str(new), return_state=True)
    chained = state.result()
    chained_report = RoundReport.load(Path(chained.round_dir) / "report.json")
    assert chained_report.trajectories.prompts == report.trajectories.prompts + 4
    assert chained.model_in != summary.model_in and chained_report.lineage_base == summary.model_in
    assert read_block(chained.model)["lineage"] == {"base": summary.model_in, "rounds": 2}
    states = _task_states(state.state_details.flow_run_id)
    assert states["evaluate lineage base model"] == "Reused", states
    assert states["the champion on this evaluation"] == "Completed", states
    checks = {c.name: c for c in chained.registry.gate_checks}
    assert f"the lineage base model's {summary.base_accuracy:.4f}" in checks["accuracy_vs_base"].reason
    assert "n=4" in checks["tpf_vs_champion"].reason and "n=8" in checks["tpf_vs_champion"].reason

    mlflow.set_tracking_uri(jf_env["tracking_uri"])
    model = mlflow.pyfunc.load_model("models:/jf-test@champion")
    prompts = ["program: a=85; step -8; return f", "program: a=3; step +2; step -1; return c"]
    texts = model.predict(prompts)
    from jf_core.decoding.ar import ar_decode
    from jf_core.models import load_model

    hf, tok = load_model(summary.model)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    greedy = ar_decode(hf, ids, max_new_tokens=24, stop=StopTokens(tok.eos_token_id, tok.pad_token_id))
    assert texts == [tok.decode(s, skip_special_tokens=True) for s in greedy.sequences]


def test_a_round_trains_with_fsdp2_on_two_ray_train_workers(prefect_server, jf_env):
    """The same flow with training.strategy fsdp2 and 2 workers: Ray Train shards the model, writes sharded
    checkpoints, and rank 0's consolidated model is evaluated and registered like a one-process one."""

    from jacobi_forcing.flows.round import jf_round
    from jf_core.round.results import TrainResult

    overrides = {"training": {"strategy": "fsdp2"}, "compute": {"train_workers": 2}}
    summary = jf_round(jf_env["profile"], overrides=overrides)
    report = RoundReport.load(Path(summary.round_dir) / "report.json")
    trained = TrainResult.model_validate_json((Path(summary.model) / "done.json").read_text())
    assert trained.strategy == "fsdp2" and trained.workers == 2 and trained == report.train
    assert summary.registry.version
    assert not (Path(summary.round_dir) / "checkpoints").exists()  # removed once the model was complete
