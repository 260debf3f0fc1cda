"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every process it starts, before
it builds the model runner, so the patches below are in place in the process that verifies drafts.

Two wraps, both pass-through, at the narrowest places that hold what the Jacobi update needs:
- `rejection_sampler.rejection_sample`: records the target's greedy token at every draft position (the guesses past
  the first rejection are the next Jacobi iterate; vLLM discards them);
- `GPUModelRunner.propose_draft_token_ids` (the CPU runner is its subclass): tells a JacobiProposer which request
  each batch row is, its prompt and token budget, and that step's verification, which `propose()` is not given.
Proposers other than ours are untouched. On a vLLM version the patches were not written for, nothing is patched and
only a Jacobi proposer is refused, by name (versions.py): the entry point runs in every vLLM process of the
environment, and must not break vLLM for anyone else."""

from __future__ import annotations

import functools
import inspect
import logging

from jf_vllm.versions import PATCH_MARK, UnsupportedVLLMVersion, check_vllm_version

log = logging.getLogger(__name__)


def register() -> None:
    import vllm

    try:
        check_vllm_version(vllm.__version__)
    except UnsupportedVLLMVersion as err:
        log.warning("jf_vllm: not patching vLLM: %s", err)
        return
    if is_registered():
        return
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.worker import gpu_model_runner

    rejection_sampler.rejection_sample = _recording(rejection_sampler.rejection_sample)
    runner = gpu_model_runner.GPUModelRunner
    runner.propose_draft_token_ids = _binding_rows(runner.propose_draft_token_ids)
    log.info("jf_vllm: Jacobi plugin registered for vLLM %s", vllm.__version__)


def is_registered() -> bool:
    """Whether this process's vLLM model runner carries the patch (the proposer checks the same mark)."""
    try:
        from vllm.v1.worker import gpu_model_runner
    except ImportError:  # a vLLM this plugin was not written for: nothing of it was patched
        return False
    return bool(getattr(gpu_model_runner.GPUModelRunner.propose_draft_token_ids, PATCH_MARK, False))


def _recording(rejection_sample):
    from jf_vllm.verification import VERIFICATIONS

    signature = inspect.signature(rejection_sample)

    @functools.wraps(rejection_sample)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        # Taken before the call: the sampler may work on the logits in place. Post-constraint logits, so the argmax
        # is the token greedy decoding would pick (penalties, bad words and logits processors included).
        VERIFICATIONS.record(
            bound.arguments["draft_token_ids"],
            bound.arguments["num_draft_tokens"],
            bound.arguments["target_logits"].argmax(dim=-1),
            bound.arguments["bonus_token_ids"],
        )
        return rejection_sample(*args, **kwargs)

    return wrapper


def _binding_rows(propose_draft_token_ids):
    from jf_vllm.proposer import JacobiProposer, rows_of
    from jf_vllm.worker_stats import worker_stats

    signature = inspect.signature(propose_draft_token_ids)
    stats = worker_stats()

    @functools.wraps(propose_draft_token_ids)
    def wrapper(self, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        bound = signature.bind(self, *args, **kwargs)
        if isinstance(drafter, JacobiProposer):
            drafter.bind(rows_of(self, bound.arguments["spec_decode_metadata"]))
        out = propose_draft_token_ids(self, *args, **kwargs)
        if stats is not None:
            stats.count(bound.arguments["sampled_token_ids"], drafter)
        return out

    setattr(wrapper, PATCH_MARK, True)
    return wrapper
