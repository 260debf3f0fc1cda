"""Shared fixtures: tiny random-weight models of two real architectures, built from config objects (no downloads),
and the embedded default model (its shipped weights)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("DO_NOT_TRACK", "true")
# A test that renders a job template or runs a flow with no server URL gets Prefect's temporary server, which must
# start within 20 s by default: on the loaded CI machine one took longer and its test failed (stop 91,
# tests/infra/test_work_pools.py). The same 120 s the module fixture's harness allows.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

# The suite runs in three pytest-xdist workers on two CPUs (pyproject.toml's addopts), most of whose slow tests wait on
# servers, windows and leases: each worker runs one thread, for its own ops and for every process it starts (jf reads
# JF_CPUS), so no multi-threaded op ever waits on a thread the others' load descheduled (that cost 10x); when all
# three compute they share the CPUs, one thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("JF_CPUS", "1")
torch.set_num_threads(min(2 if "JF_CPUS" not in os.environ else int(os.environ["JF_CPUS"]), torch.get_num_threads()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Beside the other workers, a test marked `alone` (it measures the machine's load) runs with the CPUs to itself:
    its whole protocol (the module fixtures it sets up and tears down included) holds the workers' lock file
    exclusively, every other test's shared. A turnstile ahead of the lock lets an `alone` test in before the other
    worker's next test, which would otherwise always find the lock free first."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")  # xdist's id of this run, shared by its workers
    if run is None:
        yield
        return
    import fcntl
    import tempfile
    from pathlib import Path

    root = Path(tempfile.gettempdir()) / f"jf-pytest-{run}"
    root.mkdir(exist_ok=True)
    alone = item.get_closest_marker("alone") is not None
    with open(root / "cpus.turnstile", "a") as turnstile, open(root / "cpus.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # both released when the files close


# MLflow's default experiment keeps artifacts under ./mlruns of the working directory: a test that logs there writes
# into the repository (a test in tests/tasks/test_registry_model.py did). The run fails if one appears.
STRAY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mlruns")
STRAY_BEFORE = pytest.StashKey[bool]()


def pytest_sessionstart(session):
    session.config.stash[STRAY_BEFORE] = os.path.exists(STRAY)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or session.config.stash.get(STRAY_BEFORE, True):
        return  # the workers' own sessions, or a directory that was there before this run
    if os.path.exists(STRAY):
        print(f"\n{STRAY} was written by a test: it logged to MLflow's default experiment", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    """The longest files first, so the workers (which take whole files, in this order) finish together instead of
    one starting the stack test as the other ends: files with a `slow` test before the rest, and among them the longer
    `timeout` their author gave first; the order within a file is kept. Files holding an `alone` test go last: such a
    test waits for the other workers' current tests to end, and at the end of the run that is a short one (the slow
    files' tests took minutes each to release it)."""

    def timeout(item) -> float:
        mark = item.get_closest_marker("timeout")
        return float(mark.args[0]) if mark and mark.args else 0.0

    files: dict[str, tuple[bool, bool, float]] = {}
    for item in items:
        alone, slow, longest = files.get(item.path, (False, False, 0.0))
        files[item.path] = (
            alone or item.get_closest_marker("alone") is not None,
            slow or item.get_closest_marker("slow") is not None,
            max(longest, timeout(item)),
        )
    rank = {path: (alone, not slow, -longest) for path, (alone, slow, longest) in files.items()}
    items.sort(key=lambda item: rank[item.path])  # stable: a file's tests stay together and in order


VOCAB = 512
PAD = 0


def _qwen2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _llama() -> torch.nn.Module:
    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(cfg).eval()


TINY_MODELS = {"qwen2": _qwen2, "llama": _llama}


@pytest.fixture(scope="session", autouse=True)
def _temporary_prefect_servers_stop_inside_the_session():
    """A test that runs a flow with no server URL gets Prefect's temporary server, which Prefect stops at interpreter
    exit and logs so: by then pytest has closed the stream that Prefect's handler writes to, and every run ended in
    `ValueError: I/O operation on closed file`. Stopped here (after the events and logs still queued for it are sent),
    the line is logged while the stream is open."""
    yield
    if (server := sys.modules.get("prefect.server.api.server")) is None:
        return
    _drain_prefect_workers()  # what they hold goes to the server before it stops
    for running in list(server.SubprocessASGIServer._instances.values()):
        running.stop()


def _drain_prefect_workers(timeout: float = 30) -> None:
    """Send what Prefect's events and log workers hold, waiting at most `timeout` seconds each. Prefect's test harness
    drains them with no timeout as it exits, and an events worker whose client never answers held a module's teardown
    until pytest's timeout (seen in an order of modules the one-process suite never met: a worker started in an earlier
    module, for another server, still held the events; the harness then waited on it). Drained here, the workers
    are stopped and gone from Prefect's registry: the next event starts a worker for the current server, and the
    harness's own drain finds nothing left."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (EventsWorker, APILogWorker):
        worker.drain_all(timeout=timeout)


@pytest.fixture(scope="module")
def prefect_server():
    """A real temporary Prefect server (Prefect's own test harness) for the module's flows; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    _drain_prefect_workers()  # a worker started for another server (a test's own) would send this module's there
    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()
        _drain_prefect_workers()


def serving_prior(ar_above_batch: int | None, break_even_tpf: float = 0.0, hardware: str = "test CPU"):
    """A serving prior as `jf tune` stores one, saying `ar_above_batch` and `break_even_tpf` (0: any acceptance
    pays); its crossover is a nominal one (the dispatch reads the two)."""
    from jf_core.model_dir import Crossover, ServingPrior

    return ServingPrior(Crossover([1], [1.0], [1.0]), ar_above_batch, break_even_tpf, hardware, "float32")


@pytest.fixture(scope="session", params=sorted(TINY_MODELS))
def tiny_model(request) -> torch.nn.Module:
    return TINY_MODELS[request.param]()


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded default, as the package ships it."""
    from jf_core.models import load_model
    from jf_core.toy.bootstrap import embedded_model

    path = embedded_model()
    return load_model(str(path))


@pytest.fixture(scope="session")
def profile(tmp_path_factory):
    """A profile over a tiny random Qwen2 with the embedded task's tokenizer and a JSONL of prompts (three bad)."""
    from jf_core.config import ComputeConfig, ModelConfig, Profile, StorageConfig, TrajectoryConfig
    from jf_core.toy.model import ToyModelConfig, build_model
    from jf_core.toy.task import make_split
    from jf_core.toy.tokenizer import build_tokenizer
    from jf_core.trajectory.prompts import PromptSourceConfig

    root = tmp_path_factory.mktemp("traj")
    tok = build_tokenizer()
    model = build_model(
        ToyModelConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64),
        len(tok),
        tok.pad_token_id,
        tok.eos_token_id,
        0,
    )
    model.config.max_position_embeddings = 64
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rows = [{"id": e.uid, "prompt": e.prompt} for e in make_split("train", 22)]
    rows += [{"id": "empty", "prompt": "   "}, {"id": "huge", "prompt": "a=1; " * 40}, {"id": "nofield", "text": "x"}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Profile(
        name="test",
        model=ModelConfig(path=str(root / "model"), dtype="float32"),
        prompts=PromptSourceConfig(source=str(root / "prompts.jsonl"), id_field="id"),
        trajectory=TrajectoryConfig(block_size=8, max_new_tokens=24, batch_size=4, shard_size=4),
        compute=ComputeConfig(workers=2),
        storage=StorageConfig(runs_dir=str(root / "runs")),
    )
