"""GPU slots on a real Prefect server (`prefect server start`, its repossessor looking every 2 s): a stage that
runs longer than its lease keeps its GPUs the whole time because the lease is renewed, a second round's stage
cannot take them meanwhile, and they come back when the stage ends. The control, on the same server in the same
minutes: a lease nobody renews is repossessed, so the test would fail if renewal did not happen. And the round's
tasks refuse to run a GPU stage without the limit, before any work."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from prefect import flow

from jacobi_forcing.infra import gpu_limit
from jacobi_forcing.tasks import round_tasks
from jacobi_forcing.tasks.gpu_slots import GPULimitMissing, gpu_slots, gpus_needed
from tests.processes import stop_group, wait_for

LEASE = 60  # Prefect's shortest lease


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A real `prefect server start` (not the test harness's ephemeral server, which runs no repossessor), on
    127.0.0.1 with its own sqlite database; its repossessor looks every 2 s."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from jacobi_forcing.infra.stack import free_port

    home = tmp_path_factory.mktemp("prefect")
    for attempt in range(3):
        port = free_port()
        env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "2",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
        }
        env.pop("PREFECT_API_URL", None)
        log_path = home / f"server-{attempt}.log"
        log = open(log_path, "w")  # noqa: SIM115 (open for the server's whole life)
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        api = f"http://127.0.0.1:{port}/api"
        try:
            wait_for(f"{api}/health", server, log_path, timeout=120)
            break
        except AssertionError:
            log.close()
            # Another worker's process (a Ray server) took the free port before this server bound it: the server
            # exited saying so ("Port N is already in use"), and another port is tried.
            taken = server.poll() is not None and "already in use" in log_path.read_text().lower()
            if not taken or attempt == 2:
                if server.poll() is None:
                    stop_group(server)
                raise
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            yield api
    finally:
        stop_group(server)
        log.close()


def gpu_profile(profile, limit: str, **compute):
    data = profile.model_dump(mode="json")
    data["compute"].update(gpus_per_worker=1, gpu_limit=limit, gpu_lease_seconds=LEASE, **compute)
    if data["compute"].get("train_workers", 1) > 1:
        data["training"]["strategy"] = "fsdp2"
    return type(profile).model_validate(data)


def active(name: str) -> int:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def test_gpus_needed_per_stage(profile):
    assert [gpus_needed(profile, s) for s in ("trajectories", "train", "evaluate")] == [0, 0, 0]  # a CPU profile
    gpu = gpu_profile(profile, "gpu", workers=8, train_workers=4)
    assert [gpus_needed(gpu, s) for s in ("trajectories", "train", "evaluate")] == [8, 4, 1]
    with gpu_slots(profile, "train") as held:  # no server needed: CPU stages take nothing
        assert held == 0


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stage_longer_than_its_lease_keeps_its_gpus_until_it_ends(prefect_api, profile):
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency

    gpu_limit.ensure(prefect_api, name="jf-gpu-test", slots=1)
    gpu_limit.ensure(prefect_api, name="jf-gpu-control", slots=1)
    with get_client(sync_client=True) as client:  # the control: a lease taken once and never renewed
        client.increment_concurrency_slots_with_lease(["jf-gpu-control"], 1, "concurrency", LEASE)
    started = time.monotonic()
    with gpu_slots(gpu_profile(profile, "jf-gpu-test"), "train") as held:
        assert held == 1
        seen = []
        while time.monotonic() - started < LEASE + 20:  # past the lease, the renewal and a few repossessor loops
            seen.append(active("jf-gpu-test"))
            time.sleep(5)
        assert set(seen) == {1}, seen
        assert active("jf-gpu-control") == 0  # lapsed and repossessed in the same minutes: renewal is what kept ours
        second = concurrency("jf-gpu-test", occupy=1, timeout_seconds=3, lease_duration=LEASE, strict=True)
        with pytest.raises(TimeoutError), second:  # a second round's GPU stage waits for the slot
            pass
    assert active("jf-gpu-test") == 0  # given back at the end of the stage


def test_a_round_refuses_a_gpu_stage_without_the_limit_before_any_work(prefect_api, profile, tmp_path):
    from tests.reports import PACKING  # the packed examples' result the train stage is made from

    gpu = gpu_profile(profile, "no-such-gpu-limit")

    @flow
    def one_stage():
        return round_tasks.train(gpu, "unused-model", str(tmp_path / "round"), PACKING)

    with pytest.raises(
        GPULimitMissing, match=r"compute\.gpu_limit: no global concurrency limit named 'no-such-gpu-limit'"
    ):
        one_stage()
    assert not (tmp_path / "round").exists()


def test_a_stage_needing_more_gpus_than_the_limit_has_is_refused(prefect_api, profile):
    gpu_limit.ensure(prefect_api, name="jf-gpu-small", slots=2)
    stage = gpu_slots(gpu_profile(profile, "jf-gpu-small", workers=8), "trajectories")
    with (
        pytest.raises(GPULimitMissing, match="the trajectories stage needs 8 GPUs but the 'jf-gpu-small' limit has 2"),
        stage,
    ):
        pass
    assert active("jf-gpu-small") == 0
