"""A Jacobi Forcing model's stored decode config as vLLM's `speculative_config`. Pure: the main environment builds
it for `jf serve --engine vllm`, the vLLM environment for the benchmark.

The block size n of the stored config becomes n - 1 speculative tokens; the stored crossover (`ar_above_batch`:
above this batch size our AR beat Jacobi on the hardware it was tuned on) becomes vLLM's
`num_speculative_tokens_per_batch_size` schedule, so above it no drafts are proposed and vLLM decodes plain AR."""

from __future__ import annotations

from pathlib import Path

from jf_core.model_dir import ServingPrior, read_block
from jf_vllm.proposer import PROPOSER_CLASS

DEFAULT_BLOCK_SIZE = 16


def stored_block(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a model directory (no config.json)")
    return dict(read_block(model_dir) or {})


def speculative_config(
    model_dir: str | Path,
    *,
    block_size: int | None = None,
    ar_above_batch: int | str | None = "stored",
    max_num_seqs: int = 256,
) -> dict:
    """vLLM's speculative config for Jacobi decoding of `model_dir`. `block_size` and `ar_above_batch` override the
    stored values (`ar_above_batch=None`: draft at every batch size)."""
    block = stored_block(model_dir)
    n = int(block_size or (block.get("decode") or {}).get("block_size") or DEFAULT_BLOCK_SIZE)
    if n < 2:
        raise ValueError(f"block_size must be >= 2 for speculative decoding, got {n}")
    k = n - 1
    config: dict = {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": k}
    prior = ServingPrior.of_block(block)
    stored = prior.ar_above_batch if prior else None
    above = stored if ar_above_batch == "stored" else ar_above_batch
    if above is not None:
        above = int(above)
        if above < 0:
            raise ValueError(f"ar_above_batch must be >= 0, got {above}")
        schedule = [[1, above, k]] if above >= 1 else []
        if above < max_num_seqs:
            schedule.append([above + 1, max_num_seqs, 0])
        config["num_speculative_tokens_per_batch_size"] = schedule
    return config
