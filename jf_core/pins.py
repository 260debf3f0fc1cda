"""The private APIs of dependencies this project reaches into, and the versions each was written against.

A private name changes between releases without notice, so each use is listed here with the versions it was
written against (pyproject.toml pins the same ranges), checked where the dependency's private API is first used
(`require`), and refused by name on any other version, naming both versions, as jf_vllm/versions.py does for vLLM.
The one exception is cosmetic (`Pin.refuse=False`): outside its versions the hook is skipped and nothing breaks.
tests/test_pins.py checks that every listed name exists in the installed versions. Only importlib.metadata is read
here, never the dependencies themselves.
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
    distribution: str
    versions: str  # PEP 440 specifiers: the versions the uses were written against
    uses: tuple[str, ...]  # "module:attribute" (or "module" alone) of every private name used
    why: str
    refuse: bool = True  # False: a cosmetic use, skipped (not refused) on other versions


PINS: dict[str, Pin] = {
    pin.distribution: pin
    for pin in (
        Pin(
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
            ">=0.19,<0.20",
            ("gguf.quants:_type_traits",),
            "which GGUF quantization types the gguf package can dequantize (jf_core/model_import.py)",
        ),
        Pin(
            "transformers",
            ">=5.17,<5.25",
            ("transformers.modeling_gguf_pytorch_utils:tqdm",),
            "the GGUF reader's bar drawn only on a terminal (jf_core/model_import.py)",
            refuse=False,
        ),
    )
}


class UnsupportedVersion(RuntimeError):
    """A dependency whose private API this project uses is installed at a version it was not written against."""


def supported(distribution: str) -> bool:
    """Whether the installed `distribution` is one the pinned uses were written against."""
    pin = PINS[distribution]
    installed = Version(importlib.metadata.version(distribution))
    return SpecifierSet(pin.versions).contains(installed, prereleases=True)


def require(distribution: str) -> bool:
    """Check the installed `distribution` before its private API is used: raise UnsupportedVersion naming both
    versions (a cosmetic pin: log and return False, and the caller skips its hook)."""
    if supported(distribution):
        return True
    pin = PINS[distribution]
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
