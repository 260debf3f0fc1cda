"""`JacobiProposer`: vLLM's `custom_class` speculative method with Jacobi decoding as the drafter.

    LLM(model=DIR, speculative_config=jf_vllm.spec_config.speculative_config(DIR))

The block size is `num_speculative_tokens + 1`; the draft initialiser, seed and recycling come from the model's
stored decode config (the `jacobi_forcing` block of its config.json), so the drafts follow the same rules as
jf_core's decoder on the same model. Batch-size gating is vLLM's own `num_speculative_tokens_per_batch_size`: vLLM
hands a custom proposer no draft budget, so the proposer reads the same schedule with vLLM's own function and
proposes nothing where it says 0.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jf_core.decoding import config_from_dict
from jf_vllm.drafting import JacobiDraftConfig, JacobiDrafter, Row, Verification

log = logging.getLogger(__name__)

PROPOSER_CLASS = "jf_vllm.proposer.JacobiProposer"


@dataclass(frozen=True)
class RowMeta:
    """What the model runner knows of a batch row and `propose()` is not given."""

    req_id: str
    prompt_len: int
    max_left: int
    verification: Verification | None


def rows_of(runner: Any, spec_decode_metadata: Any) -> list[RowMeta]:
    """The batch's rows in the runner's order (the order of `propose()`'s arguments), with this step's verification."""
    from jf_vllm.verification import VERIFICATIONS

    batch = runner.input_batch
    verified = VERIFICATIONS.take(spec_decode_metadata.draft_token_ids) if spec_decode_metadata is not None else None
    rows = []
    for i, req_id in enumerate(batch.req_ids):
        state = runner.requests[req_id]
        params = state.sampling_params
        max_tokens = params.max_tokens if params is not None and params.max_tokens is not None else 1 << 30
        rows.append(
            RowMeta(
                req_id=req_id,
                prompt_len=int(batch.num_prompt_tokens[i]),
                max_left=max_tokens - len(state.output_token_ids),
                verification=verified[i] if verified is not None and i < len(verified) else None,
            )
        )
    return rows


def jacobi_block(model_config: Any) -> dict:
    """The model's `jacobi_forcing` block: from the HF config vLLM loaded, or the directory's config.json."""
    block = getattr(getattr(model_config, "hf_config", None), "jacobi_forcing", None)
    if block is None:
        path = Path(str(model_config.model)) / "config.json"
        block = json.loads(path.read_text()).get("jacobi_forcing") if path.is_file() else None
    return dict(block or {})


class JacobiProposer:
    def __init__(self, vllm_config: Any) -> None:
        import vllm

        from jf_vllm.versions import PATCH_MARK, check_vllm_version

        check_vllm_version(vllm.__version__)  # first: another version may not have the runner imported below
        from vllm.v1.worker import gpu_model_runner

        # The plugin's mark on the runner it patched: its patches are in this process.
        if not getattr(gpu_model_runner.GPUModelRunner.propose_draft_token_ids, PATCH_MARK, False):
            raise RuntimeError(
                "JacobiProposer needs the jf_vllm plugin's patches in this process; vLLM loads them through the "
                "'vllm.general_plugins' entry point of the jacobi-forcing package. Is the package installed in "
                "vLLM's environment (scripts/setup_vllm.sh), and does VLLM_PLUGINS (when set) name 'jacobi_forcing'?"
            )
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        stored = jacobi_block(vllm_config.model_config).get("decode")
        decode = config_from_dict(stored) if stored else None  # the model's decode config, as jf_core reads it
        self.config = JacobiDraftConfig(
            block_size=self.num_speculative_tokens + 1,
            draft_init=decode.draft_init if decode else "prompt_sample",
            seed=decode.seed if decode else 0,
            recycle=bool(getattr(decode, "seed_drafts", False)),  # a Jacobi Forcing config's field
        )
        self.drafter = JacobiDrafter(self.config, vllm_config.model_config.get_vocab_size())
        self._schedule: list[int] | None = None
        if spec.num_speculative_tokens_per_batch_size:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            self._schedule = build_dynamic_sd_schedule_lookup(
                spec.num_speculative_tokens_per_batch_size,
                vllm_max_batch_size=vllm_config.scheduler_config.max_num_seqs,
                vllm_num_speculative_tokens=self.num_speculative_tokens,
            )
        self._rows: list[RowMeta] | None = None
        log.info("jf_vllm: Jacobi proposer, %s, schedule %s", self.config, spec.num_speculative_tokens_per_batch_size)

    def bind(self, rows: list[RowMeta]) -> None:
        self._rows = rows

    def limit(self, batch_size: int) -> int:
        """Draft tokens allowed at this batch size by vLLM's schedule (all of them without one)."""
        if self._schedule is None or batch_size <= 0:
            return self.num_speculative_tokens
        return self._schedule[min(batch_size, len(self._schedule) - 1)]

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        rows, self._rows = self._rows, None
        if rows is None or len(rows) != len(sampled_token_ids):
            raise RuntimeError(
                f"jf_vllm: propose() got {len(sampled_token_ids)} rows but the runner bound "
                f"{'none' if rows is None else len(rows)}: the plugin's runner patch did not run for this step"
            )
        limit = self.limit(len(sampled_token_ids))
        drafts = []
        for i, (meta, sampled) in enumerate(zip(rows, sampled_token_ids, strict=True)):
            if not sampled or limit == 0:
                drafts.append([])
                continue
            context = token_ids_cpu[i, : int(num_tokens_no_spec[i])].tolist()
            row = Row(
                req_id=meta.req_id,
                prompt=context[: meta.prompt_len],
                context=context,
                sampled=list(sampled),
                max_left=meta.max_left,
                verification=meta.verification,
            )
            drafts.append(self.drafter.draft(row, limit))
        self.drafter.forget([meta.req_id for meta in rows])
        return drafts

    # vLLM calls these on some proposers; a Jacobi drafter holds no weights and no KV cache.
    def load_model(self, *args, **kwargs) -> None:
        return None
