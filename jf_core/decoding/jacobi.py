"""Jacobi decoding with exact KV-cache reuse, batched, lossless: greedy, or sampling (sampling.py).

A block of n tokens starts as [the known-correct next token] + an initial draft of n - 1 tokens. Each forward runs
a sequence's unverified window on top of its committed KV, takes the argmax at every position and accepts the
longest prefix that greedy AR would have produced (`verify.accepted_length`). Accepted tokens' KV was computed under
a fully correct prefix, so it is committed as is; the rest is dropped. The window shrinks to
[correct token at the mismatch] + [greedy guesses for the rest]; when a whole block is accepted, the bonus argmax
after it opens the next block. Every forward commits >= 1 token, so output equals greedy AR token for token, in
at most as many forwards.

Sequences in a batch accept different counts per forward; `KVState` keeps their caches exact with per-row slot
masks. Multi-block decoding (multiblock.py) changes how much of the window runs and how the verdict is settled,
through `JacobiDecoder.room`, `layout` and `settle`; the forward and verification below are the only copy of the
Jacobi step.

Proposal and verification read apart: the decoder's proposers (proposers/: a draft adapter's chain, prompt lookup,
recycling) add branches and draft chains to the window's layout, and may replace the next guesses with their own;
with none, the next guesses are the model's own picks. The window and every branch are verified by the base alone.
Acceptance is unchanged, so the output is the base's greedy output (or, sampling, the base's sample).

Sampling changes one thing: the token after each slot is the `Sampler`'s pick (the Gumbel-max sample with the
request's noise at that output position) instead of the argmax. Given the noise it is a function of the prefix, so
"greedy" below reads as "the pick" and every argument above holds for the AR sampler with the same seeds.

Why one module of 350 lines: the Jacobi step (layout, forward, verification, commit) is one state machine over
`SequenceState` and `KVState`, which the extensions subclass; its pieces are read together or not at all.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Protocol

import torch

from jf_core.decoding.backends import grouped_attention
from jf_core.decoding.clock import NO_CLOCK, NoClock
from jf_core.decoding.common import (
    DecodeOutput,
    StopTokens,
    TokenSink,
    check_inputs,
    finish,
    first_eos,
    left_pad,
    model_device,
)
from jf_core.decoding.draft import DraftInitName, make_draft_init, sequence_rng
from jf_core.decoding.kv import KVState
from jf_core.decoding.layout import Layout, tree_positions_and_mask
from jf_core.decoding.proposers import Room, proposers_for
from jf_core.decoding.sampling import Sampler, Sampling
from jf_core.decoding.stats import DecodeStats, SequenceStats, Timer
from jf_core.decoding.verify import accepted_length


@dataclass(frozen=True)
class JacobiConfig:
    block_size: int = 16
    max_new_tokens: int = 256
    draft_init: DraftInitName = "prompt_sample"
    seed: int = 0
    compact_waste: float = 0.5  # squeeze cache holes out once this fraction of slots is dead
    # With a draft adapter: how many window slots after the root the draft chain covers (0: every slot whose guess
    # is ever read). Slots past it take the base's own guesses, as plain Jacobi does; a forward carries
    # n + span tokens instead of 2n - 2. Drafts far past what a forward accepts rarely matter, and on hardware where
    # cost grows with width (any CPU) every slot is paid for.
    draft_span: int = 0
    # With a draft adapter: False decodes as the input model would, the adapter kept but unused, so a tune can find
    # that a corpus or a lookup pays where the adapter's cycle does not (a round's model keeps both).
    adapter: bool = True

    def __post_init__(self) -> None:
        if self.draft_span < 0:
            raise ValueError(f"draft_span must be >= 0 (0: the whole window), got {self.draft_span}")
        if self.block_size < 1:
            raise ValueError(f"block_size (n) must be >= 1, got {self.block_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 <= self.compact_waste <= 1.0:
            raise ValueError(f"compact_waste must be in [0, 1], got {self.compact_waste}")

    def describe(self) -> str:
        """The config as every table and console line names it (one place: `n=16`, `n=8 span=3`)."""
        return (
            f"n={self.block_size}"
            + (f" span={self.draft_span}" if self.draft_span else "")
            + ("" if self.adapter else " no-adapter")
        )


class BlockRecorder(Protocol):
    """Receives every draft state of every block, the initial draft first, down to the fixed point.

    Each state is a fresh list of the block's tokens (accepted prefix + current window); nothing passed here is
    written to afterwards. The last state of a converged block equals its fixed point. A block that ends at EOS
    converges with `length` = tokens through EOS, and the positions after EOS hold the pad token in its fixed point
    (and so in its last state): greedy decoding never computes them."""

    def block_state(self, sequence: int, block: int, state: list[int]) -> None: ...

    def block_converged(self, sequence: int, block: int, fixed_point: list[int], length: int) -> None: ...


class BlockStates:
    """The BlockRecorder that keeps everything: every state of every (sequence, block), in order, and each converged
    block's (fixed point, length). Trajectory collection and on-policy states read it."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
        self.fixed: dict[tuple[int, int], tuple[list[int], int]] = {}

    def block_state(self, sequence: int, block: int, state: list[int]) -> None:
        self.states[(sequence, block)].append(state)

    def block_converged(self, sequence: int, block: int, fixed_point: list[int], length: int) -> None:
        self.fixed[(sequence, block)] = (fixed_point, length)


@dataclass
class SequenceState:
    index: int
    prompt: list[int]
    rng: random.Random
    committed: list[int] = field(default_factory=list)  # generated tokens whose KV is in the cache
    window: list[int] = field(default_factory=list)  # unverified tokens of the current block; [0] is known-correct
    block: int = 0
    block_accepted: list[int] = field(default_factory=list)
    block_length: int = 0
    block_converged: bool = False
    last_state: list[int] = field(default_factory=list)
    stats: SequenceStats = field(default_factory=SequenceStats)
    output: list[int] = field(default_factory=list)  # final tokens so far (committed + the known-correct next)
    done: bool = False
    streamed: int = 0  # how much of `output` went to on_tokens
    memory: dict = field(default_factory=dict)  # each proposer's own, by its name
    wins: Counter = field(default_factory=Counter)  # forwards won by a branch other than the window, by its owner


class JacobiDecoder:
    def __init__(
        self,
        model: torch.nn.Module,
        config: JacobiConfig,
        *,
        stop: StopTokens,
        recorder: BlockRecorder | None = None,
        on_tokens: TokenSink | None = None,
        sampling: Sampling | None = None,
        clock: NoClock = NO_CLOCK,
    ) -> None:
        self.model = model
        self.clock = clock
        self.sampling = sampling
        self.config = config
        self.eos = stop.eos
        self.pad_token_id = stop.pad
        self.recorder = recorder
        self.on_tokens = on_tokens
        self.draft_init = make_draft_init(config.draft_init, model.config.vocab_size)
        self.proposers = proposers_for(model, config)  # who adds to the window's forward (none: the window alone)

    @torch.inference_mode()
    def decode(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int] | None = None) -> DecodeOutput:
        """`seeds`: one per prompt when sampling (default 0, 1, 2, ...): a request's noise, so its text does not
        depend on the batch it shares."""
        with grouped_attention(self.model):  # multi-token windows read grouped KV heads in place (CPU)
            return self._decode(prompts, seeds)

    def _decode(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int] | None) -> DecodeOutput:
        cfg = self.config
        prompts = check_inputs(prompts, cfg.max_new_tokens)
        self.sampler = Sampler(self.sampling, seeds, len(prompts))
        device = model_device(self.model)
        timer = Timer(device)
        seqs = [self.new_sequence(i, p) for i, p in enumerate(prompts)]

        start = timer.now()
        ids, mask = left_pad(prompts, self.pad_token_id, device)
        kv, last_logits = KVState.prefill(self.model, ids, mask)
        first_tokens = self.sampler.pick(last_logits[:, None], range(len(seqs)), torch.zeros_like(ids[:, :1]))
        for seq, first in zip(seqs, first_tokens[:, 0].tolist(), strict=False):
            self._open_block(seq, first)
        self._stream(seqs)
        active = self._drop_finished(kv, seqs)
        prefilled = timer.now()

        batch_forwards = 0
        while active:
            self.step(kv, active)
            batch_forwards += 1
            self._stream(active)
            with self.clock.part("drop+compact"):
                active = self._drop_finished(kv, active)
                kv.compact(cfg.compact_waste)
        end = timer.now()

        stats = DecodeStats(
            sequences=[s.stats for s in seqs],
            prefill_seconds=prefilled - start,
            decode_seconds=end - prefilled,
            batch_forwards=batch_forwards,
        )
        return DecodeOutput(sequences=[s.output for s in seqs], stats=stats)

    def new_sequence(self, index: int, prompt: list[int]) -> SequenceState:
        seq = SequenceState(index=index, prompt=prompt, rng=sequence_rng(self.config.seed, prompt))
        seq.memory = {p.name: memory for p in self.proposers if (memory := p.begin(seq)) is not None}
        return seq

    # -- the Jacobi step ---------------------------------------------------------------------------------------

    def step(self, kv: KVState, active: list[SequenceState]) -> None:
        """One forward for every active sequence: run its layout, verify every branch, commit the best one's
        accepted prefix, rebuild the window. Its parts are timed by the decoder's clock (clock.py names them)."""
        clock = self.clock
        with clock.part("layout"):
            self.plan(kv, active)
            layouts = [self._proposed(s) for s in active]
        with clock.part("tensors"):
            width = max(len(lay.tokens) for lay in layouts)
            device = kv.valid.device
            rows = [lay.tokens + [self.pad_token_id] * (width - len(lay.tokens)) for lay in layouts]
            tokens = torch.tensor(rows, dtype=torch.long, device=device)
            plain = all(len(lay.branches) == 1 and not lay.drafts for lay in layouts)
            depth, mask = (None, None) if plain else tree_positions_and_mask(layouts, width, device)
        with clock.part("forward"):
            if plain:
                logits = kv.forward(tokens)
            else:
                with ExitStack() as acting:
                    for proposer in self.proposers:
                        acting.enter_context(proposer.acting(self.model, layouts, width, device))
                    logits = kv.forward(tokens, depth, mask)
        with clock.part("pick"):
            greedy = self._pick(logits, active, depth).tolist()
        with clock.part("verify"):
            live, kept = self._verify(active, layouts, greedy, width)
        with clock.part("keep"):
            kv.keep(torch.tensor(live, device=device), kept)
        clock.cycle(tokens.numel())
        clock.outcome(layouts, greedy)

    def _verify(
        self, active: list[SequenceState], layouts: list[Layout], greedy: list[list[int]], width: int
    ) -> tuple[list[list[bool]], int]:
        """Each row's best branch and its accepted prefix; the proposers' guesses and learning; the settling.
        Returns the slots each row keeps and 1 + the last slot any row keeps."""
        live = [[False] * width for _ in active]
        kept = 0
        for row, (seq, lay) in enumerate(zip(active, layouts, strict=True)):
            best, accepted = 0, 0
            for b, branch in enumerate(lay.branches):
                if b == 0:  # the window: a plain prefix of the row, no gathering on the hot path
                    n_ok = accepted_length(lay.tokens[: len(branch)], greedy[row])
                else:
                    n_ok = accepted_length([lay.tokens[i] for i in branch], [greedy[row][i] for i in branch])
                if n_ok > accepted:  # ties keep the earlier branch: the main window first
                    best, accepted = b, n_ok
            for i in lay.branches[best][:accepted]:
                live[row][i] = True
            kept = max(kept, lay.branches[best][accepted - 1] + 1)
            picks = greedy[row]
            for proposer in self.proposers:
                picks = proposer.guesses(lay, picks, accepted)
            for proposer in self.proposers:
                proposer.learn(seq, lay, picks, best, accepted)
            self.settle(seq, lay, picks, best, accepted)
        return live, kept

    def _pick(self, logits: torch.Tensor, active: list[SequenceState], depth: torch.Tensor | None) -> torch.Tensor:
        """The token after every slot. Sampling needs each slot's output position: the row's committed length
        (window[0]'s position) + the slot's depth in its chain + 1."""
        if self.sampler.greedy:
            return logits.argmax(-1)
        if depth is None:
            depth = torch.arange(logits.shape[1], device=logits.device).expand(len(active), -1)
        base = torch.tensor([len(s.committed) for s in active], device=logits.device)
        return self.sampler.pick(logits, [s.index for s in active], base[:, None] + depth + 1)

    def plan(self, kv: KVState, active: list[SequenceState]) -> None:
        """Before a forward's layouts are built: decisions that look at the whole batch (extensions)."""

    def _proposed(self, seq: SequenceState) -> Layout:
        room = self.room(seq)
        lay = self.layout(seq, room)
        for proposer in self.proposers:
            lay = proposer.extend(seq, lay, room)
        return lay

    def room(self, seq: SequenceState) -> Room:
        """How much of the window the next forward runs (all of it) and where branches must stop (its end)."""
        return Room(run=len(seq.window), window=len(seq.window), block_left=len(seq.window))

    def layout(self, seq: SequenceState, room: Room) -> Layout:
        """The window's part of the next forward: its first `room.run` tokens as one chain (proposers add to it)."""
        return Layout(seq.window[: room.run], [list(range(room.run))])

    def settle(self, seq: SequenceState, layout: Layout, greedy: list[int], branch: int, accepted: int) -> None:
        width = len(layout.branches[0])  # the window is the row's first `width` slots
        self._settle_window(seq, layout.tokens[:width], greedy[:width], accepted)

    def _settle_window(self, seq: SequenceState, window: list[int], greedy: list[int], accepted: int) -> None:
        """Commit `window[:accepted]` and set up the next window (or the next block)."""
        seq.stats.forwards += 1
        seq.stats.accepted.append(accepted)
        seq.committed += window[:accepted]
        seq.block_accepted += window[:accepted]
        if accepted < len(window):
            # The argmax at the mismatch is correct (its prefix is); the later guesses seed the next iteration.
            seq.window = [greedy[accepted - 1], *greedy[accepted : len(window) - 1]]
            if self.recorder is not None:
                self._emit(seq, seq.block_accepted + seq.window)
                known = seq.block_accepted + seq.window[:1]
                if len(seq.window) == 1 or first_eos(known, self.eos) is not None:
                    # Every token of the block (through EOS) is known: the fixed point is reached. The next
                    # forward would only compute the bonus token; the sequence may stop before it.
                    self._converged(seq, known)
            self._check_done(seq)
            return
        if self.recorder is not None and not seq.block_converged:
            # A fully accepted window leaves the state as it was: the last recorded state is the fixed point and
            # this forward only confirmed it, so it is not recorded twice.
            self._converged(seq, list(seq.block_accepted))
        seq.block += 1
        self._open_block(seq, greedy[-1])

    def _emit(self, seq: SequenceState, state: list[int]) -> None:
        assert self.recorder is not None
        seq.last_state = state
        self.recorder.block_state(seq.index, seq.block, state)

    def _converged(self, seq: SequenceState, known: list[int]) -> None:
        """`known`: the block's tokens known to be greedy's, all of them or at least through EOS."""
        end = first_eos(known, self.eos)
        length = end + 1 if end is not None else len(known)
        fixed_point = known[:length] + [self.pad_token_id] * (seq.block_length - length)
        if fixed_point != seq.last_state:
            self._emit(seq, fixed_point)
        seq.block_converged = True
        assert self.recorder is not None
        self.recorder.block_converged(seq.index, seq.block, list(fixed_point), length)

    def _open_block(self, seq: SequenceState, first: int) -> None:
        seq.block_accepted = []
        seq.block_converged = False
        seq.window = [first]
        if self._check_done(seq):
            return
        # Never draft past max_new_tokens: those positions could not be emitted anyway.
        seq.block_length = min(self.config.block_size, self.config.max_new_tokens - len(seq.committed))
        seq.window = [first, *self.new_draft(seq, seq.prompt + seq.committed + [first], seq.block_length - 1)]
        if self.recorder is not None:
            self._emit(seq, list(seq.window))

    def new_draft(self, seq: SequenceState, context: list[int], length: int) -> list[int]:
        """The initial draft of `length` tokens after `context`: the first proposer's seed that offers one, the rest
        from the draft initialiser."""
        seed: list[int] = []
        for proposer in self.proposers:
            if seed := proposer.seed(seq, context, length):
                break
        return seed + self.draft_init(context + seed, length - len(seed), seq.rng)

    def _check_done(self, seq: SequenceState) -> bool:
        seq.output, seq.done = finish(seq.committed + seq.window[:1], self.eos, self.config.max_new_tokens)
        seq.stats.new_tokens = len(seq.output)
        return seq.done

    def _stream(self, seqs: list[SequenceState]) -> None:
        """Hand each sequence's newly final tokens (its output grew by them) to `on_tokens`."""
        if self.on_tokens is None:
            return
        for seq in seqs:
            if len(seq.output) > seq.streamed:
                self.on_tokens(seq.index, seq.output[seq.streamed :])
                seq.streamed = len(seq.output)

    def _drop_finished(self, kv: KVState, seqs: list[SequenceState]) -> list[SequenceState]:
        keep = [i for i, s in enumerate(seqs) if not s.done]
        if len(keep) < len(seqs) and keep:
            kv.select_rows(torch.tensor(keep, device=kv.valid.device))
        return [seqs[i] for i in keep]


def jacobi_decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    stop: StopTokens,
    recorder: BlockRecorder | None = None,
    on_tokens: TokenSink | None = None,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
) -> DecodeOutput:
    decoder = JacobiDecoder(
        model,
        config,
        stop=stop,
        recorder=recorder,
        on_tokens=on_tokens,
        sampling=sampling,
    )
    return decoder.decode(prompts, seeds)
