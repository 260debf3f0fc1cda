"""GPU stages hold slots of a Prefect global concurrency limit named for the GPUs (`compute.gpu_limit`, default
`gpu`), one slot per GPU the stage occupies, so two rounds on one host or pool never load models onto the same GPUs
at once: a second round's trajectories wait for the first round's training instead of dying of out-of-memory.

Slots are leases: Prefect renews them from a background thread every fraction of `compute.gpu_lease_seconds`
while the stage runs, and its repossessor frees them when the lease lapses, so a worker that dies holding GPUs
gives them back within one lease instead of never. A renewal that fails stops the stage (it no longer owns the
GPUs). The limit must exist (`jf stack up` creates it with the host's GPU count; elsewhere
`prefect gcl create gpu --limit <GPUs>`): a round refuses to run GPU stages ungoverned. CPU stages take nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from jf_core.config import Profile

STAGES = ("trajectories", "train", "evaluate")


class GPULimitMissing(RuntimeError):
    pass


def gpus_needed(profile: Profile, stage: str) -> int:
    """GPUs a stage of this profile occupies: the trajectory actors', the training workers', or the one the flow
    evaluates on. 0 for a CPU profile (compute.gpus_per_worker 0)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    c = profile.compute
    if c.gpus_per_worker <= 0:
        return 0
    workers = {"trajectories": c.workers, "train": c.train_workers, "evaluate": 1}[stage]
    return max(1, math.ceil(workers * c.gpus_per_worker))


@contextmanager
def gpu_slots(profile: Profile, stage: str) -> Iterator[int]:
    """Hold the stage's GPU slots for the body's duration (renewed leases); yields the number held."""
    n = gpus_needed(profile, stage)
    name = profile.compute.gpu_limit
    if n == 0 or name is None:
        yield 0
        return
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            raise GPULimitMissing(
                f"compute.gpu_limit: no global concurrency limit named {name!r} on the Prefect server; create it "
                f"with `prefect gcl create {name} --limit <GPUs in the pool>` (jf stack up does), or set "
                "compute.gpu_limit to null to run GPU stages without one"
            ) from None
    if n > limit.limit:
        raise GPULimitMissing(
            f"the {stage} stage needs {n} GPUs but the {name!r} limit has {limit.limit} slots: it would wait "
            "forever (raise the limit or lower compute.workers / compute.train_workers)"
        )
    with concurrency(
        name,
        occupy=n,
        lease_duration=profile.compute.gpu_lease_seconds,
        strict=True,
        raise_on_lease_renewal_failure=True,
    ):
        yield n
