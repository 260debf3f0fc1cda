"""`jf serve` on a Ray it did not start (a joined cluster), where Serve and other applications may already run: it
serves on the cluster's Serve, refuses by name an address or an application name it cannot have, and when it stops
only its own application goes. Before, its stop ran serve.shutdown(), taking every other team's application down.

The Ray here is the test's own (private, loopback, token): `run` finds a Ray already up in its process, which it
did not start, exactly as when it joins a cluster through RAY_ADDRESS."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from ray import serve

from jacobi_forcing.infra.ray_cluster import ray_session
from jacobi_forcing.infra.serve_app import APP, PROXY_READY_ENV, ServeConflict, ServeOptions, run
from jacobi_forcing.infra.stack import free_port

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Neighbour:
    """Another team's application on the same cluster."""

    async def __call__(self, request) -> str:
        return "still here"


def test_jf_serve_on_a_joined_ray_stops_only_its_own_application(profile, monkeypatch):
    options = ServeOptions(model_path=profile.model.path, name="tiny", device="cpu")
    sigint = signal.getsignal(signal.SIGINT)
    # The cluster's own setting, as jf serve gives a Ray it starts: without it, CI's busy host took more than the
    # default 3 x 5 s to start this Serve's proxy and serve.start below failed (ActorDiedError).
    for key, value in PROXY_READY_ENV.items():
        monkeypatch.setenv(key, value)
    with ray_session(num_cpus=2):
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(Neighbour.bind(), name="neighbour", route_prefix="/neighbour", blocking=False)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/neighbour", timeout=30).text == "still here"

        # The cluster's Serve listens where it listens: another port would be a URL nobody answers.
        with pytest.raises(ServeConflict, match=f"not 127.0.0.1:{port + 1}: .* pass --host 127.0.0.1 --port {port}"):
            run(options, port=port + 1)

        seen = {}

        def ready(at: str) -> None:
            seen["url"] = at
            seen["models"] = httpx.get(f"{at}/v1/models", timeout=30).json()
            seen["neighbour"] = httpx.get(f"{at}/neighbour", timeout=30).text
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in jf serve's terminal sends

        run(options, port=port, ready=ready)
        assert seen == {"url": url, "models": seen["models"], "neighbour": "still here"}
        assert [m["id"] for m in seen["models"]["data"]] == ["tiny"]
        # Stopped: its application is gone, Serve and the neighbour are not.
        assert set(serve.status().applications) == {"neighbour"}
        assert httpx.get(f"{url}/neighbour", timeout=30).text == "still here"
        assert signal.getsignal(signal.SIGINT) is sigint  # the caller's Ctrl-C is its own again

        # A second jf serve on a cluster where one already runs would replace it without a word: refused by name.
        serve.run(Neighbour.bind(), name=APP, route_prefix="/", blocking=False)
        with pytest.raises(ServeConflict, match=f"already runs an application named '{APP}'"):
            run(options, port=port)
        assert set(serve.status().applications) == {"neighbour", APP}
        serve.shutdown()
