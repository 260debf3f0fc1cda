"""A model reference resolved to something `models.load_model` opens, by one function for every command option, flow
parameter, profile and server that names a model.

The forms: `embedded` (the embedded default, bootstrapped into $JF_HOME on first use), `package:<distribution>`
(the GGUF an installed package holds, imported once into $JF_HOME/models), `models:/<name>@<alias>` or
`models:/<name>/<version>` (a registered checkpoint, downloaded once per version), a local directory, or a hub id.
The registry form needs MLflow, which this library does not import: the layer that does passes `registry`
(`jacobi_forcing.tasks.model_package.resolve_model` is this function with MLflow's registry plugged in).
"""

from __future__ import annotations

from collections.abc import Callable

from jf_core.model_import import PACKAGE_SCHEME, ensure_package_model

EMBEDDED = "embedded"
REGISTRY_SCHEME = "models:/"


def resolve_model(
    ref: str,
    *,
    threads: int | None = None,
    on_log: Callable[[int, dict], None] | None = None,
    registry: Callable[[str], str] | None = None,
) -> str:
    """`ref` as a local directory or a hub id. `threads`: the embedded model's bootstrap trains on that many (the
    profile's compute.threads: the count is part of what the model is); `on_log(step, row)` gets the bootstrap's
    logged rows instead of a terminal bar. `registry` resolves `models:/` references."""
    if ref == EMBEDDED:
        from jf_core.toy.bootstrap import BootstrapConfig, ensure_embedded_model

        return str(ensure_embedded_model(BootstrapConfig(threads=threads), progress=on_log is None, on_log=on_log))
    if ref.startswith(PACKAGE_SCHEME):
        # fp32 whatever the profile computes in: a bf16 profile casts at load, from exact dequantized values
        return str(ensure_package_model(ref))
    if ref.startswith(REGISTRY_SCHEME):
        if registry is None:
            raise ValueError(
                f"model {ref}: a registered model is read from MLflow's registry; resolve it with "
                "jacobi_forcing.tasks.model_package.resolve_model (every `jf` command does)"
            )
        return registry(ref)
    return ref
