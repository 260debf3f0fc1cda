"""The vLLM versions the plugin's patches were written against. The patches wrap two private functions
(plugin.py); their signatures change between vLLM releases without notice, so any other version is refused by name
instead of failing somewhere inside the engine."""

from __future__ import annotations

SUPPORTED_VLLM_VERSIONS = ("0.32.0",)

# Set on the runner's method the plugin patched (plugin.py): the patch's own mark, which the proposer reads to know
# that the patches are in its process without importing the plugin (which imports the proposer).
PATCH_MARK = "jf_binds_rows"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVLLMVersion unless `version` (vllm.__version__) is one the patches were written against."""
    base = version.split("+", 1)[0]  # local build tags (0.32.0+cpu) do not change the Python code
    if base not in SUPPORTED_VLLM_VERSIONS:
        raise UnsupportedVLLMVersion(
            f"jf_vllm supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}, not {version}: the Jacobi plugin patches "
            "vLLM's rejection sampler and model runner, whose private signatures change between releases. Install "
            "a supported version (scripts/setup_vllm.sh) or unset the plugin with VLLM_PLUGINS=''."
        )
