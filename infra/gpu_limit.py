"""The `gpu` global concurrency limit GPU stages take slots of (tasks/gpu_slots.py): one slot per GPU of the pool.

`jf stack up` creates it sized to this host's GPUs (at least 1, so a CPU host can still run a GPU profile's
plumbing); a pool of several GPU hosts sets it to the pool's total (`prefect gcl update gpu --limit N`). An existing
limit is left as it is: an operator's size wins."""

from __future__ import annotations

GPU_LIMIT = "gpu"


def host_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch or a broken driver: no GPU to count
        return 0


def ensure(api_url: str | None = None, *, name: str = GPU_LIMIT, slots: int | None = None) -> int:
    """Create the limit when missing; return its slots. `api_url`: the Prefect API (default: the client's)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    settings = {PREFECT_API_URL: api_url} if api_url else {}
    with temporary_settings(updates=settings), get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name).limit
        except ObjectNotFound:
            size = slots or max(1, host_gpus())
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
            return size
