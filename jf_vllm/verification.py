"""The last verification pass of this process, as the Jacobi update needs it: per request, the drafts verified, the
target's greedy token at each draft position and the bonus token. vLLM's proposer interface passes the committed
tokens but not these guesses, so plugin.py records them where the rejection sampler has them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from jf_vllm.drafting import Verification


class VerificationLog:
    """Holds one pass, keyed by the draft tensor it verified: a proposal only uses the record of its own step (a
    step whose drafter did not run leaves a record no later step can match)."""

    def __init__(self) -> None:
        self._key: torch.Tensor | None = None
        self._rows: list[Verification | None] = []

    def record(
        self,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: Sequence[int],
        target_argmax: torch.Tensor,
        bonus_token_ids: torch.Tensor,
    ) -> None:
        drafts, argmax = draft_token_ids.tolist(), target_argmax.tolist()
        bonus = bonus_token_ids.reshape(-1).tolist()
        rows: list[Verification | None] = []
        start = 0
        for i, k in enumerate(num_draft_tokens):
            rows.append(Verification(drafts[start : start + k], argmax[start : start + k], bonus[i]) if k else None)
            start += k
        self._key, self._rows = draft_token_ids, rows

    def take(self, draft_token_ids: torch.Tensor | None) -> list[Verification | None] | None:
        """The rows recorded for the pass that verified `draft_token_ids` (then forgotten), or None."""
        if draft_token_ids is None or self._key is not draft_token_ids:
            return None
        rows, self._key, self._rows = self._rows, None, []
        return rows


VERIFICATIONS = VerificationLog()
