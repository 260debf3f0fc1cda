"""`jf serve` as a Ray Serve application: each replica loads the model once and serves the OpenAI-compatible API
(`infra/openai_app.py`) over its own batcher; `--replicas N` scales it across a Ray cluster (KubeRay: a
`RayService` runs the same application).

Ray Serve's HTTP proxy binds 127.0.0.1 unless told otherwise (`--host`), and the Ray under it is the project's
(`infra/ray_cluster.ray_session`: private, loopback only, token auth; or the cluster named by RAY_ADDRESS).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ray import serve

from jf_core import pins

pins.require("ray")  # a replica's gRPC port and the running Serve's client are private names (jf_core/pins.py)


@dataclass
class ServeOptions:
    model_path: str  # a local checkpoint directory (models:/ URIs are resolved before)
    name: str  # the model id clients send
    max_batch: int = 16
    max_wait_ms: float = 10.0
    method: str = "auto"  # auto: the artifact's dispatch; jacobi or ar: forced (for comparisons)
    max_tokens_limit: int = 1024
    dtype: str = "auto"
    device: str = "auto"


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
@serve.ingress()
class JFServer:
    """One replica: the model loaded once, its batcher, and the OpenAI API built over them at replica start."""

    def __init__(self, options: dict) -> None:
        from jf_core.serving.batcher import Batcher
        from jf_core.serving.engine import Engine

        _replica_grpc_on_loopback()
        self.options = ServeOptions(**options)
        opts = self.options
        engine = Engine.load(opts.model_path, name=opts.name, dtype=opts.dtype, device=opts.device)
        self.batcher = Batcher(engine, max_batch=opts.max_batch, max_wait_s=opts.max_wait_ms / 1000, method=opts.method)

    def __serve_build_asgi_app__(self):
        from jacobi_forcing.infra.openai_app import build_app

        return build_app(self.batcher, self.options.name, max_tokens_limit=self.options.max_tokens_limit)


def _replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 starts an inter-deployment gRPC server in every replica bound to `[::]` (every interface),
    with no setting to change it: on a Ray that lives on loopback only it would be the one socket reachable from
    the network. Bind it to 127.0.0.1 there (runs in the replica, before Serve starts that server). On a
    multi-node cluster replicas must reach each other: the cluster's network policy guards it
    (infra/kuberay/networkpolicy.yaml)."""
    import ray
    import ray.serve._private.replica as replica

    if ray.util.get_node_ip_address() != "127.0.0.1" or getattr(replica.add_port_to_grpc_server, "loopback", False):
        return
    bind = replica.add_port_to_grpc_server

    def on_loopback(server, address: str):
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    on_loopback.loopback = True
    replica.add_port_to_grpc_server = on_loopback


def application(options: ServeOptions, replicas: int = 1):
    return JFServer.options(num_replicas=replicas).bind(asdict(options))


class _OptionsAppliedAbove(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "will not be applied" not in record.getMessage()


APP = "jacobi-forcing"  # the Serve application `jf serve` runs (route prefix "/")


class ServeConflict(ValueError):
    """Serve on a joined cluster cannot take this server as asked (its HTTP address differs, or the name is taken)."""


def _running_serve() -> dict | None:
    """The details of the Serve instance this Ray already runs (its HTTP options, its applications), or None."""
    from ray.serve.context import _get_global_client  # serve.status() has the applications, not the HTTP options

    client = _get_global_client(raise_if_no_controller_running=False)
    return client.get_serve_details() if client is not None else None


def _check_joinable(details: dict, host: str, port: int) -> None:
    """On a cluster whose Serve already runs, the HTTP address is the cluster's: refuse an address it does not have
    (the server would say a URL nobody listens on), and an application of ours already running (serve.run would
    replace another user's server without a word)."""
    http = details.get("http_options") or {}
    if (http.get("host"), http.get("port")) != (host, port):
        raise ServeConflict(
            f"Serve already runs on this Ray with HTTP on {http.get('host')}:{http.get('port')}, not {host}:{port}: "
            f"its address is the cluster's; pass --host {http.get('host')} --port {http.get('port')}"
        )
    if APP in (details.get("applications") or {}):
        raise ServeConflict(
            f"Serve on this Ray already runs an application named {APP!r} (another jf serve): stop it first "
            f"(`serve.delete('{APP}')`), or serve from a Ray of its own (unset RAY_ADDRESS)"
        )


def run(options: ServeOptions, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1, ready=None) -> None:
    """Start Serve on the project's Ray and block until SIGINT/SIGTERM; `ready(url)` is called once it answers.

    On a Ray this process did not start (a joined cluster), Serve and its other applications are not ours: at the
    end only this server's application goes, and Serve itself only when this call started it and nothing else
    runs on it."""
    stop = threading.Event()
    callers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _serve_until(stop, options, host=host, port=port, replicas=replicas, ready=ready)
    finally:
        for sig, handler in callers.items():  # a caller that goes on (a test, a notebook) gets its Ctrl-C back
            signal.signal(sig, handler)


# Serve's controller kills an HTTP proxy that has not answered its 5 s readiness check three times and starts
# another, and serve.start, waiting on the first one, fails with ActorDiedError: on a busy 2-core machine a proxy
# takes longer than that to start. The processes of a Ray started after this inherit the environment (a joined
# cluster keeps its own settings).
PROXY_READY_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}


def give_proxies_time() -> None:
    """Give the HTTP proxies of a Ray this process starts next a minute to come up (`PROXY_READY_ENV`)."""
    for key, value in PROXY_READY_ENV.items():
        os.environ.setdefault(key, value)


def _serve_until(stop: threading.Event, options: ServeOptions, *, host: str, port: int, replicas: int, ready) -> None:
    from jacobi_forcing.infra.ray_cluster import ray_session

    give_proxies_time()
    with ray_session() as session:
        before = None if session.private else _running_serve()
        if before is not None:
            _check_joinable(before, host, port)
        else:
            serve.start(http_options={"host": host, "port": port})
            # serve.run then finds the Serve instance just started here and logs that new http options "will not be
            # applied": they were, by that start. Said on every start, it reads as a misconfiguration.
            logging.getLogger("ray.serve").addFilter(_OptionsAppliedAbove())
        try:
            serve.run(application(options, replicas), name=APP, route_prefix="/", blocking=False)
            if ready is not None:
                ready(f"http://{host}:{port}")
            stop.wait()
        finally:
            # A private Ray goes down whole at the end of the session, Serve with it. Its serve.shutdown() only
            # printed Ray's `(raylet) Task ServeController.graceful_shutdown failed ... killed by ray.kill` on every
            # normal stop (the controller kills itself while its own shutdown call is in flight).
            if not session.private:
                serve.delete(APP)
                if before is None and not serve.status().applications:
                    serve.shutdown()


def build(args: dict):
    """Serve's application builder (`import_path: jacobi_forcing.infra.serve_app:build`, e.g. in a KubeRay
    RayService): `args` holds ServeOptions' fields; `model_path` is any model reference (`models:/<name>@<alias>`
    resolved through MLFLOW_TRACKING_URI into $JF_HOME, which a cluster shares; `package:`; `embedded`) and
    `replicas` the number of replicas."""
    from jacobi_forcing.tasks.model_package import resolve_model

    args = dict(args)
    replicas = int(args.pop("replicas", 1))
    path = resolve_model(str(args.pop("model_path")))
    args.setdefault("name", Path(path).name)
    return application(ServeOptions(model_path=path, **args), replicas)
