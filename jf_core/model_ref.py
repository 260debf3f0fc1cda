"""A model reference resolved to something `models.load_model` opens, by one function for every command option, flow
parameter, profile and server that names a model.

The forms: `embedded` (the embedded default as the package ships it, copied into $JF_HOME on first use),
`package:<distribution>` (the GGUF an installed package holds, imported once into $JF_HOME/models),
`models:/<name>@<alias>` or `models:/<name>/<version>` (a registered checkpoint, downloaded once per version), a
`.gguf` file (imported once next to itself: a copied file is all a machine needs), a local directory, or a hub id.
The registry form needs MLflow, which this library does not import: the layer that does passes `registry`
(`jacobi_forcing.tasks.model_package.resolve_model` is this function with MLflow's registry plugged in).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jf_core.model_import import PACKAGE_SCHEME, ensure_gguf_model, ensure_package_model

EMBEDDED = "embedded"
REGISTRY_SCHEME = "models:/"


def resolve_model(
    ref: str,
    *,
    registry: Callable[[str], str] | None = None,
) -> str:
    """`ref` as a local directory or a hub id. `registry` resolves `models:/` references."""
    if ref == EMBEDDED:
        from jf_core.toy.bootstrap import embedded_model

        return str(embedded_model())
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
    if ref.endswith(".gguf") and Path(ref).expanduser().is_file():
        return str(ensure_gguf_model(ref))
    return ref
