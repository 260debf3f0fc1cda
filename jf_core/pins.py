"""The private APIs of dependencies this project reaches into, and the versions each was written against.

A private name changes between releases without notice, so each use is listed here with the versions it was
written against (pyproject.toml pins the same ranges), checked where the dependency's private API is first used
(`require(name)`), and refused by name on any other version, naming both versions, as jf_vllm/versions.py does for
vLLM. A cosmetic use (`Pin.refuse=False`) is skipped instead: outside its versions its hook is left out and nothing
breaks. The standard library's few (STDLIB) are listed too. tests/test_pins.py checks that every listed name exists
in the installed versions and that the code uses no private name of anyone else's that is not listed here. Only
importlib.metadata is read here, never the dependencies themselves.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

log = logging.getLogger("jf.pins")


@dataclass(frozen=True)
class Pin:
    name: str  # what `require` is called with
    distribution: str
    versions: str  # PEP 440 specifiers: the versions the uses were written against
    uses: tuple[str, ...]  # "module:attribute" ("module:Class.attribute", or "module" alone) of each private name
    why: str
    refuse: bool = True  # False: a cosmetic use, skipped (not refused) on other versions


PINS: dict[str, Pin] = {
    pin.name: pin
    for pin in (
        Pin(
            "ray",
            "ray",
            ">=2.60,<2.61",
            (
                "ray._private.ray_constants:ENABLE_RAY_CLUSTER",  # loopback-only Ray (infra/ray_cluster.py)
                "ray._raylet:Config",  # re-reading the auth settings after they change
                "ray._raylet:AuthenticationTokenLoader",
                "ray.train.torch.config:_TorchBackend",  # Ray Train's rendezvous on loopback
                "ray.train.torch.config:_set_torch_distributed_env_vars",
                "ray.train._internal.worker_group:WorkerGroup",
                "ray.serve._private.replica:add_port_to_grpc_server",  # a replica's gRPC port on loopback
                "ray.serve.context:_get_global_client",  # a running Serve's HTTP options (infra/serve_app.py)
            ),
            "Ray offers no public setting for a loopback-only cluster, Ray Train's rendezvous address or a replica's "
            "gRPC address",
        ),
        Pin(
            "gguf",
            "gguf",
            ">=0.19,<0.20",
            ("gguf.quants:_type_traits",),
            "which GGUF quantization types the gguf package can dequantize (jf_core/model_import.py)",
        ),
        Pin(
            "transformers-model",
            "transformers",
            ">=5,<5.26",
            (
                # the attention backend a model runs on (decoding/backends.py: restored after a tree step;
                # training/losses.py: the mask built for it); transformers sets it through set_attn_implementation,
                # with no public getter
                "transformers.configuration_utils:PreTrainedConfig._attn_implementation",
                # a model that cannot take a DynamicCache (RWKV, xLSTM): refused by decoding (decoding/kv.py)
                "transformers.generation.utils:GenerationMixin._supports_default_dynamic_cache",
                "transformers.modeling_utils:PreTrainedModel._supports_sdpa",  # the fallback backend for trees
                # a model whose attention goes through the attention interface: it can run on grouped SDPA
                # (decoding/backends.py, decoding/grouped_attention.py)
                "transformers.modeling_utils:PreTrainedModel._supports_attention_backend",
                "transformers.modeling_utils:PreTrainedModel._no_split_modules",  # FSDP2 shards these decoder layers
            ),
            "what a model is and runs on, as transformers' own loaders read it; these are class attributes every "
            "model class declares, with no public accessor",
        ),
        Pin(
            "transformers-gguf-bar",
            "transformers",
            ">=5.17,<5.26",
            ("transformers.modeling_gguf_pytorch_utils:tqdm",),
            "the GGUF reader's bar drawn only on a terminal (jf_core/model_import.py)",
            refuse=False,
        ),
        Pin(
            "torch-packed",
            "torch",
            ">=2.13,<2.14",
            (
                "torch:ops.mkldnn._reorder_linear_weight",  # a weight in oneDNN's blocked layout, once
                "torch:ops.mkldnn._linear_pointwise",  # the product on it (what torch.compile's frozen CPU graphs run)
                "torch:Tensor._version",  # a weight written in place since it was packed
            ),
            "a CPU model's layers on oneDNN's packed weights (jf_core/layers/packed.py); elsewhere they run on "
            "F.linear, slower on a CPU but the same values to rounding",
            refuse=False,
        ),
        Pin(
            "prefect-server",
            "prefect",
            ">=3.4,<4",
            ("prefect.server.api.server:SubprocessASGIServer._run_uvicorn_command",),
            "Prefect's temporary server started in a session of its own, so a terminal's Ctrl-C reaches jf alone "
            "(jf_cli/orchestrate.py); elsewhere the server starts as Prefect starts it",
            refuse=False,
        ),
    )
}
# The standard library's private names in use, stable across the Python versions this project supports (checked to
# exist by tests/test_pins.py, never refused).
STDLIB = (
    "os:_exit",  # a simulated lost worker dies without cleanup (tasks/: the fault tests' chaos hooks)
    "argparse:_SubParsersAction",  # the CLI's reference walks every subcommand (jf_cli/main.py)
    "argparse:ArgumentParser._actions",
    "sys:_base_executable",  # the sandbox's interpreter outside a virtual environment (jf_core/evaluation/sandbox.py)
    # a fork server imported under other settings is replaced by one under the caller's (jf_core/round/fresh.py)
    "multiprocessing.forkserver:_forkserver",
    "multiprocessing.forkserver:ForkServer._stop",
)


class UnsupportedVersion(RuntimeError):
    """A dependency whose private API this project uses is installed at a version it was not written against."""


def supported(name: str) -> bool:
    """Whether the installed distribution of pin `name` is one its uses were written against."""
    pin = PINS[name]
    installed = Version(importlib.metadata.version(pin.distribution))
    return SpecifierSet(pin.versions).contains(installed, prereleases=True)


def require(name: str) -> bool:
    """Check the installed distribution of pin `name` before its private API is used: raise UnsupportedVersion
    naming both versions (a cosmetic pin: log and return False, and the caller skips its hook)."""
    if supported(name):
        return True
    pin = PINS[name]
    distribution = pin.distribution
    installed = importlib.metadata.version(distribution)
    message = (
        f"{distribution} {installed} is installed, but this project uses its private API ({', '.join(pin.uses)}) "
        f"as written against {distribution}{pin.versions}: {pin.why}. Install {distribution}{pin.versions} "
        "(pyproject.toml pins it)"
    )
    if pin.refuse:
        raise UnsupportedVersion(message)
    log.debug("skipped: %s", message)
    return False
