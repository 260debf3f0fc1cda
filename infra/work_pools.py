"""The GPU work pools prefect.yaml's real-profile deployments run on, with the job templates in `work-pools/`:

- `jf-gpu-docker` (Docker worker): each flow run is a container with `gpus` NVIDIA GPUs (`device_requests`, as
  `docker run --gpus N` sends them; the host needs the NVIDIA Container Toolkit) and a 16 GB /dev/shm (NCCL and
  torch's workers need more than Docker's 64 MB).
- `jf-gpu-k8s` (Kubernetes worker): each flow run is a Job whose pod requests and limits `gpus` `nvidia.com/gpu`
  (the NVIDIA device plugin's resource), tolerates the GPU nodes' taint, can be pinned with `node_selector`, and
  mounts a memory-backed /dev/shm.

Both start from Prefect's default templates for those worker types (prefect-docker, prefect-kubernetes); the
Kubernetes one also moves `completions` and `parallelism` to the Job spec, where the API expects them (the default
puts them in the pod spec). `jf stack up` creates the pools on the local server (no worker: the GPU hosts run
`prefect worker start --pool jf-gpu-k8s --type kubernetes`, with prefect-kubernetes installed). An existing pool is
left as it is. The image must hold the project at the path `prefect deploy` recorded (or add a `pull:` step)."""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATES = Path(__file__).with_name("work-pools")
GPU_POOLS = {"jf-gpu-docker": ("docker", "docker-gpu.json"), "jf-gpu-k8s": ("kubernetes", "kubernetes-gpu.json")}


def template(pool: str) -> dict:
    return json.loads((TEMPLATES / GPU_POOLS[pool][1]).read_text())


def ensure(api_url: str | None = None) -> list[str]:
    """Create the GPU pools that are missing; returns the names created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    created = []
    settings = {PREFECT_API_URL: api_url} if api_url else {}
    with temporary_settings(updates=settings), get_client(sync_client=True) as client:
        for name, (kind, _) in GPU_POOLS.items():
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type=kind, base_job_template=template(name)))
                created.append(name)
    return created
