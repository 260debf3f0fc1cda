"""What a request drafts next under Jacobi decoding, given what vLLM's last verification pass saw. Pure Python: the
same block semantics as jf_core's Jacobi decoder (jf_core/decoding/jacobi.py), expressed in vLLM's terms.

vLLM verifies a request's step as [last token, d_1 .. d_k]; the target's greedy token after d_1..d_j is `argmax[j]`
(compared with d_{j+1}) and after all of them the bonus. With `a` drafts accepted, vLLM commits d_1..d_a and
argmax[a] (or the bonus when a == k). A Jacobi block of n tokens is one known-correct token and n - 1 drafts; its
next iterate keeps every position's greedy guess, so the drafts of the next step are argmax[a+1 .. k-1]: the
model's own guesses past the first rejected token, each made from a prefix that was wrong at one position. The block
shrinks as it converges; when every draft is accepted the next token opens a new block with a fresh draft, and when
only the last one was wrong the next step is a plain one whose token opens it. So the plugin runs jf_core's decoder
forward for forward (tests/jf_vllm/test_drafting.py), and a TPF measured with one holds for the other. A model
trained with Jacobi Forcing is trained on exactly these noisy iterates, which is why its guesses past a mismatch are
right more often than an untrained model's.

Drafts never change what vLLM outputs: its rejection sampler keeps greedy output equal to its greedy AR output
whatever is proposed; the draft only decides how many tokens a forward commits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from jf_core.decoding.draft import DraftInit, DraftInitName, make_draft_init, sequence_rng
from jf_core.decoding.proposers.recycling import NgramPool


@dataclass(frozen=True)
class Verification:
    """One request's part of a verification pass."""

    drafts: list[int]  # d_1 .. d_k as verified
    argmax: list[int]  # the target's greedy token after the prefix and d_1..d_j, for j = 0 .. k-1
    bonus: int  # the target's token after all k drafts

    def __post_init__(self) -> None:
        if len(self.drafts) != len(self.argmax):
            raise ValueError(f"verification: {len(self.drafts)} drafts but {len(self.argmax)} argmax tokens")


@dataclass(frozen=True)
class Row:
    """What the model runner knows of one request of the batch at proposal time."""

    req_id: str
    prompt: list[int]
    context: list[int]  # prompt + every committed token, the last of them the one sampled in this step
    sampled: list[int]  # the tokens this step committed (empty: the request is still in prefill)
    max_left: int  # tokens it may still generate (max_tokens - generated)
    verification: Verification | None  # None: this step verified no drafts for it


@dataclass
class _Request:
    rng: random.Random
    pool: NgramPool | None
    blocks: int = 0


@dataclass
class DraftStats:
    """Counters for the plugin's log line and the tests (vLLM's own metrics count acceptance)."""

    jacobi_updates: int = 0  # steps whose draft is the previous step's guesses
    blocks_opened: int = 0
    recycled_drafts: int = 0  # fresh blocks seeded from the n-gram pool
    inconsistent: int = 0  # a verification that did not match the committed tokens (should stay 0)


@dataclass(frozen=True)
class JacobiDraftConfig:
    block_size: int  # n: one known token + n - 1 drafts, as in jf_core's JacobiConfig
    draft_init: DraftInitName = "prompt_sample"
    seed: int = 0
    recycle: bool = False  # seed fresh blocks from an n-gram pool of the model's earlier guesses

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 to draft anything, got {self.block_size}")


class JacobiDrafter:
    def __init__(self, config: JacobiDraftConfig, vocab_size: int) -> None:
        self.config = config
        self.draft_init: DraftInit = make_draft_init(config.draft_init, vocab_size)
        self.stats = DraftStats()
        self._requests: dict[str, _Request] = {}

    def draft(self, row: Row, limit: int) -> list[int]:
        """The next draft of `row`, at most `limit` tokens (vLLM's per-batch-size schedule)."""
        if not row.sampled or limit <= 0 or row.max_left <= 0:
            return []
        request = self._requests.get(row.req_id)
        if request is None:
            pool = NgramPool(self.config.block_size - 1) if self.config.recycle else None
            request = self._requests[row.req_id] = _Request(sequence_rng(self.config.seed, row.prompt), pool)
        guesses = self._jacobi_update(request, row)
        if guesses is not None:
            self.stats.jacobi_updates += bool(guesses)
            return guesses[: min(limit, row.max_left)]
        return self._open_block(request, row, limit)

    def forget(self, live: Sequence[str]) -> None:
        """Drop the state of requests no longer in the batch (finished or preempted: a preempted one restarts its
        block when it returns, which changes only its drafts)."""
        keep = set(live)
        for req_id in [r for r in self._requests if r not in keep]:
            del self._requests[req_id]

    def _jacobi_update(self, request: _Request, row: Row) -> list[int] | None:
        """The guesses past the first rejection, or None when a new block opens."""
        verified = row.verification
        if verified is None or not verified.drafts:
            return None
        accepted = len(row.sampled) - 1
        if accepted > len(verified.drafts) or row.sampled[:accepted] != verified.drafts[:accepted]:
            # vLLM committed something other than an accepted prefix of what it verified: the record belongs to
            # another step. Drafts cannot make output wrong, so start a fresh block, and count it.
            self.stats.inconsistent += 1
            return None
        if request.pool is not None:
            request.pool.add([row.sampled[-1], *verified.argmax[accepted + 1 :], verified.bonus])
        if accepted == len(verified.drafts):
            return None  # every draft accepted: the block converged
        # Empty when only the last draft was wrong: the block is at its fixed point and, as in jf_core's decoder,
        # the next forward only computes the token that opens the next block (a plain step, no drafts).
        return verified.argmax[accepted + 1 :]

    def _open_block(self, request: _Request, row: Row, limit: int) -> list[int]:
        length = min(self.config.block_size - 1, row.max_left, limit)
        request.blocks += 1
        self.stats.blocks_opened += 1
        if request.pool is not None:
            seeded = request.pool.candidates(row.context[-1], 1, length)
            if seeded:
                self.stats.recycled_drafts += 1
                tail = self.draft_init(row.context + seeded[0], length - len(seeded[0]), request.rng)
                return [*seeded[0], *tail]
        return self.draft_init(row.context, length, request.rng)
