"""The GPU work pools' job templates, rendered by the Docker and Kubernetes workers' own code for each GPU deployment
of prefect.yaml, then checked the way the receiving end would: docker-py turns the container settings into the
Engine API's create arguments (rejecting unknown keys and malformed device requests), and the Job manifest is
walked against the Kubernetes API's models with unknown fields refused (the API server's strict field validation).
The pools are created on a real Prefect server, which validates the templates' placeholders; and every GPU
deployment asks for the GPUs its profile's largest stage occupies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from jacobi_forcing.infra import work_pools
from jacobi_forcing.tasks.gpu_slots import STAGES, gpus_needed
from jf_core.config import load_profile

ROOT = Path(__file__).resolve().parents[2]
# A non-local API: the Docker worker then needs no daemon to resolve host.docker.internal.
API = {"PREFECT_API_URL": "http://prefect.example:4200/api"}


def gpu_deployments() -> list[dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return [d for d in spec["deployments"] if d["work_pool"]["name"] in work_pools.GPU_POOLS]


def render(pool: str, values: dict):
    if work_pools.GPU_POOLS[pool][0] == "docker":
        from prefect_docker.worker import DockerWorkerJobConfiguration as Config
    else:
        from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as Config
    return prepared(asyncio.run(Config.from_template_and_values(work_pools.template(pool), values)))


def prepared(config):
    """As the worker prepares it for a flow run (env, labels, name and command filled in)."""
    from uuid import uuid4

    from prefect.client.schemas.objects import FlowRun

    config.prepare_for_flow_run(FlowRun(flow_id=uuid4(), name="jf-round-qwen-n16-abc123"))
    return config


def docker_create_args(config) -> dict:
    """What docker-py would send to the Engine API for this configuration (the same calls as containers.run)."""
    from docker.models.containers import _create_container_args
    from prefect_docker.worker import DockerWorker

    settings = DockerWorker._build_container_settings(None, None, config)  # no daemon needed with a remote API
    return _create_container_args({**settings, "version": "1.44"})


def strict_k8s(obj, kind: str, path: str = "") -> None:
    """Refuse any field the Kubernetes model `kind` does not have, recursively (values: type-checked loosely)."""
    from kubernetes_asyncio.client import models

    if kind.startswith("list["):
        assert isinstance(obj, list), f"{path}: expected a list"
        for i, item in enumerate(obj):
            strict_k8s(item, kind[5:-1], f"{path}[{i}]")
        return
    if kind.startswith("dict("):
        assert isinstance(obj, dict), f"{path}: expected a mapping"
        inner = kind[5:-1].split(",", 1)[1].strip()
        for k, v in obj.items():
            strict_k8s(v, inner, f"{path}.{k}")
        return
    if kind in ("str", "int", "bool", "float", "object", "datetime"):
        quantity = ".limits." in path or ".requests." in path or path.endswith("sizeLimit")
        allowed = {"str": (str, int, float) if quantity else str, "int": int, "bool": bool, "float": (int, float)}
        assert isinstance(obj, allowed.get(kind, object)), f"{path}: {obj!r} is not a {kind}"
        return
    model = getattr(models, kind)
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    assert isinstance(obj, dict), f"{path}: expected a {kind} object"
    unknown = set(obj) - set(by_json)
    assert not unknown, f"{path}: {kind} has no field {sorted(unknown)}"
    for key, value in obj.items():
        strict_k8s(value, model.openapi_types[by_json[key]], f"{path}.{key}")


def test_the_strict_kubernetes_check_refuses_what_the_api_would():
    from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

    template = KubernetesWorker.get_default_base_job_template()
    default = prepared(asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, {})))
    default = default.job_manifest
    with pytest.raises(AssertionError, match=r"V1PodSpec has no field \['completions', 'parallelism'\]"):
        strict_k8s(default, "V1Job")  # Prefect's own default misplaces two Job fields; ours does not


@pytest.mark.parametrize("deployment", gpu_deployments(), ids=lambda d: d["name"])
def test_a_gpu_deployment_gets_the_gpus_of_its_profile(deployment):
    pool = deployment["work_pool"]
    profile = load_profile(deployment["parameters"]["profile"])
    gpus = pool["job_variables"]["gpus"]
    assert gpus == max(gpus_needed(profile, s) for s in STAGES) > 0
    config = render(pool["name"], {**pool["job_variables"], "env": API})
    if work_pools.GPU_POOLS[pool["name"]][0] == "docker":
        args = docker_create_args(config)
        [request] = args["host_config"]["DeviceRequests"]
        assert request == {"Driver": "nvidia", "Count": gpus, "DeviceIDs": [], "Capabilities": [["gpu"]],
                           "Options": {}}  # fmt: skip
        assert args["host_config"]["ShmSize"] == 16 * 1024**3
    else:
        manifest = config.job_manifest
        strict_k8s(manifest, "V1Job")
        pod = manifest["spec"]["template"]["spec"]
        resources = pod["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == gpus
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (lambda kw: kw.update(shm_sise="16g"), TypeError, "shm_sise"),  # not a container setting
        (lambda kw: kw["device_requests"][0].update(count="{{ gpus }} GPUs"), ValueError, "count must be an integer"),
    ],
    ids=["unknown-setting", "count-not-an-integer"],
)
def test_a_broken_template_is_refused_by_docker_py(edit, error, message):
    from prefect_docker.worker import DockerWorkerJobConfiguration

    bad = work_pools.template("jf-gpu-docker")
    edit(bad["job_configuration"]["container_create_kwargs"])
    config = prepared(asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(bad, {"env": API})))
    with pytest.raises(error, match=message):
        docker_create_args(config)


def test_the_pools_are_created_on_a_real_server_and_once(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        assert sorted(work_pools.ensure()) == sorted(work_pools.GPU_POOLS)
        assert work_pools.ensure() == []
        with get_client(sync_client=True) as client:
            for name, (kind, _) in work_pools.GPU_POOLS.items():
                pool = client.read_work_pool(name)
                assert pool.type == kind and pool.base_job_template == work_pools.template(name)
