"""prefect.yaml: every deployment names a real flow and parameters the typed config accepts."""

from __future__ import annotations

from jf_core.config import ProfileOverrides, load_profile


def test_prefect_yaml_deployments_use_valid_profiles():
    """Every deployment in prefect.yaml names a flow that exists and parameters the typed config accepts."""
    import importlib
    from pathlib import Path

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "prefect.yaml").read_text())
    names = set()
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        module = path.removesuffix(".py").replace("/", ".")
        flow = getattr(importlib.import_module(module), func)
        names.add(f"{flow.name}/{d['name']}")
        params = d.get("parameters", {})
        if "profile" in params:
            load_profile(params["profile"], **params.get("overrides", {}))
            ProfileOverrides.model_validate(params.get("overrides", {}))  # what the server's schema will check
        if "profile" in params:  # GPU profiles run on the GPU pools, CPU ones on the local process pool
            gpu = load_profile(params["profile"]).compute.gpus_per_worker > 0
            assert d["work_pool"]["name"] in (("jf-gpu-docker", "jf-gpu-k8s") if gpu else ("jf-pool",)), d["name"]
        for trigger in d.get("triggers", []):  # what `prefect deploy` turns into the deployment's automations
            from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

            DeploymentEventTrigger.model_validate(trigger)
            assert set(trigger["parameters"]) <= set(flow.parameters.properties), trigger
    assert {"jf-round/tiny", "jf-round/smollm2-135m", "jf-round/qwen2.5-coder-7b", "jf-round/retrain-tiny"} <= names
    assert "jf-progressive/tiny" in names
    assert {"jf-round/retrain-on-new-prompts", "jf-benchmark/champion", "jf-ablate/tiny"} <= names
    retrain = next(d for d in spec["deployments"] if d["name"] == "retrain-tiny")
    assert retrain["schedules"][0]["cron"] and retrain["parameters"]["model"] == "models:/jf-tiny@champion"


def test_a_mistyped_override_is_refused_when_the_run_is_created(prefect_server):
    """The deployments' parameter schema comes from the flows' typed `overrides`: the Prefect server refuses an
    unknown section, an unknown field or a wrong type at `prefect deployment run`, naming it; nothing is created."""
    import asyncio
    import os
    import subprocess
    import sys

    import pytest
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from jacobi_forcing.flows.round import jf_round

    jf_round.to_deployment(name="schema-check").apply()
    for overrides, named in (
        ({"trainig": {"steps": 3}}, "trainig"),
        ({"training": {"stpes": 3}}, "stpes"),
        ({"training": {"steps": "three"}}, "three"),
    ):
        with pytest.raises(Exception, match=named):
            run_deployment("jf-round/schema-check", parameters={"overrides": overrides}, timeout=0)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    cli = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", "jf-round/schema-check", "--params",
         '{"overrides": {"evaluation": {"num_prompt": 5}}}'],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert cli.returncode != 0 and "num_prompt" in cli.stdout + cli.stderr, cli.stdout + cli.stderr

    async def count() -> int:
        async with get_client() as client:
            return len(await client.read_flow_runs())

    assert asyncio.run(count()) == 0
    good = run_deployment("jf-round/schema-check", parameters={"overrides": {"training": {"steps": 3}}}, timeout=0)
    assert good.parameters["overrides"] == {"training": {"steps": 3}}
