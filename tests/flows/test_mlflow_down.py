"""The MLflow server stopped mid-round (a real `mlflow server`, killed once training has finished): the round fails
with an error naming the server, and once the server is back a re-run registers the model without redoing any stage
that had finished (their task runs end `Reused`), and closes the failed attempt's MLflow run as FAILED."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from jacobi_forcing.infra.stack import free_port

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root, self.port, self.proc = root, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, *, new_port_on_clash: bool = True) -> None:
        """Start the server and wait for its health check. A port free when `free_port` chose it can be bound by
        another process before the server binds it: on 2026-12-07 a clean-clone run's health check was answered by
        an HTTP/2 frame (a gRPC server of a Ray beside it) while the server itself exited. Where the server exits
        while something else holds its port, a first start moves to a new port; a restart must keep its URI (the
        profile names it), so there the clash is the error."""
        for _ in range(3):
            if self._started():
                return
            assert new_port_on_clash, f"port {self.port} was taken while the server was down:\n{self._log_tail()}"
            self.port = free_port()
            self.uri = f"http://127.0.0.1:{self.port}"
        raise AssertionError(f"three ports were taken before the mlflow server bound them:\n{self._log_tail()}")

    def _started(self) -> bool:
        """True once the server answers its health check; False where it exited because its port was taken."""
        cmd = [
            sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
            "--workers", "1",
        ]  # fmt: skip
        log = open(self.root / "server.log", "a")  # noqa: SIM115 (the server's for its whole life)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # Beside the suite's other workers on a slow 2-core host the server took over 120 s to answer (a clean-clone
        # run of .ci/run, 2026-12-04): a server that is starting is given 300 s, one that died is refused at once.
        deadline, answered_by_another = time.monotonic() + 300, False
        while True:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2).close()
                return True
            except http.client.HTTPException:  # not HTTP/1 at all: another server holds the port
                answered_by_another = True
            except OSError:
                pass
            if self.proc.poll() is not None:  # the log read only when it is news
                if answered_by_another or "address already in use" in self._log_tail().lower():
                    return False
                raise AssertionError(f"mlflow server exited:\n{self._log_tail()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"mlflow server did not start in 300 s:\n{self._log_tail()}")
            time.sleep(0.5)

    def _log_tail(self) -> str:
        return (self.root / "server.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # gone, as a crashed server or a lost host is
            self.proc.wait()


def _task_states(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return {r.name: r.state.name for r in runs}

    return asyncio.run(read())


def test_a_round_whose_mlflow_server_dies_fails_by_name_and_the_rerun_redoes_nothing(prefect_server, jf_env):
    from jacobi_forcing.flows.round import jf_round

    server = MlflowServer(jf_env["tmp"])
    server.start()
    data = yaml.safe_load(Path(jf_env["profile"]).read_text())
    data["registry"]["tracking_uri"] = server.uri
    profile = jf_env["tmp"] / "remote-mlflow.yaml"
    profile.write_text(yaml.safe_dump(data))
    runs = Path(data["storage"]["runs_dir"])

    def kill_after_training() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not list(runs.glob("*/*/model/done.json")):
            time.sleep(0.2)
        server.stop()

    killer = threading.Thread(target=kill_after_training, daemon=True)
    killer.start()
    try:
        failed = jf_round(str(profile), return_state=True)
        killer.join(timeout=5)
        assert failed.is_failed(), failed
        with pytest.raises(Exception, match=f"the MLflow tracking server {server.uri} is not reachable"):
            failed.result()

        server.start(new_port_on_clash=False)  # and kept for the checks below: a server start costs about 10 s of CPU
        again = jf_round(str(profile), return_state=True)
        summary = again.result()
        states = _task_states(again.state_details.flow_run_id)
        for stage in ("trajectories", "pack", "train", "evaluate input model", "evaluate Jacobi Forcing model"):
            assert any(name.startswith(stage) and state == "Reused" for name, state in states.items()), (stage, states)
        assert summary.registry.version == "1"
        client = MlflowClient(server.uri, server.uri)
        assert len(client.search_model_versions("name='jf-test'")) == 1
        rounds = client.search_runs(
            [client.get_experiment_by_name("jacobi-forcing").experiment_id], "attributes.run_name = 'round n=8'"
        )
        assert sorted(r.info.status for r in rounds) == ["FAILED", "FINISHED"]  # the dead attempt, closed by the rerun
    finally:
        server.stop()
