"""Jacobi Forcing decoding: multi-block decoding and rejection recycling on top of the Jacobi step.

Multi-block: up to K blocks are in flight in one window. The first unconverged block is real-active: only its
accepted prefix is committed to the KV cache. The blocks after it are pseudo-active: their drafts are refined every
forward conditioned on the (unconverged) drafts before them. A new block is spawned when the newest block has
ceil(r * n) settled tokens (committed ones for the real-active block; for a pseudo-active block, the leading tokens
the last forward did not change). Verification is the usual longest greedy prefix over the whole window, so a
promoted block keeps its draft and progress and is verified against the committed prefix like any window (upstream
drops the pseudo-active blocks' progress on promotion).

Proposers (proposers/) add branches to the window's forward: rejection recycling's candidates from an n-gram pool
keyed by the window's known-correct first token, prompt lookup's guess; the branch with the longest accepted prefix
wins and the KV cache keeps exactly its slots (tree layout in one row: no cache copies, see layout.py). Their
branches stop at the real-active block's end. With `seed_drafts`, a fresh block's draft (otherwise tokens sampled
from the context) starts with the pool's newest continuation of the token before it.

Draft EOS cut: when the window's draft already holds EOS, only the window through that EOS is run. The positions
after it matter only if that EOS is rejected, and then the next forward runs them again; until then their compute
is pure waste (it is most of the last block of every answer, and on hardware whose forward cost grows with the
window, it is most of the price of a large n). Those positions keep their draft meanwhile.

All of it is lossless: every committed token passed greedy verification under a fully committed prefix.
Defaults from the paper: n=64, K=2, pool_size=4, r=0.85.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from jf_core.decoding.clock import NO_CLOCK, NoClock
from jf_core.decoding.common import DecodeOutput, StopTokens, TokenSink, first_eos
from jf_core.decoding.jacobi import BlockRecorder, JacobiConfig, JacobiDecoder, SequenceState
from jf_core.decoding.kv import KVState
from jf_core.decoding.layout import Layout
from jf_core.decoding.proposers import Room
from jf_core.decoding.proposers.suffix import MAX_NGRAM
from jf_core.decoding.sampling import Sampling
from jf_core.decoding.slot_budget import SlotBudget
from jf_core.decoding.verify import accepted_length
from jf_core.decoding.width import RowWidth, WidthPolicy


@dataclass(frozen=True)
class JFDecodeConfig(JacobiConfig):
    block_size: int = 64
    num_blocks: int = 2  # K: blocks in flight (1 = no multi-block)
    pool_size: int = 4  # recycled candidates verified per forward (0 = no recycling)
    spawn_ratio: float = 0.85  # r
    ngram: int = 0  # length of candidates verified as branches; 0 = block_size - 1
    seed_drafts: bool = False  # fresh blocks' drafts start with a recycled n-gram (free: no extra slots)
    cut_at_draft_eos: bool = True  # run the window only through the first EOS of its draft
    # Adaptive width (width.py): each forward runs about as many slots as the row is likely to accept.
    adaptive_width: bool = False
    width_scale: float = 1.5
    width_margin: int = 4
    width_floor: int = 4
    ar_below: float = 0.0  # a row accepting fewer tokens per forward runs AR steps (0: never)
    # Prompt lookup (proposers/prompt_lookup.py): up to this many tokens continuing the latest earlier occurrence of
    # the text's last `lookup_ngram` (or fewer) tokens ride as one more branch of the window's forward (0: off).
    lookup: int = 0
    lookup_ngram: int = 3
    # Suffix drafts (proposers/suffix.py): up to this many tokens continuing the text's last `suffix_ngram` (or
    # fewer, at least 2) tokens as the model's draft corpus most often does, one more branch (0: off; a model
    # without a corpus ignores it). The guess goes on while its next token is the pick of at least `suffix_share`
    # of the corpus's matches that reached it, and for no more than `suffix_factor` times the tail it matched (0:
    # no such bound; vLLM's `max_spec_factor`): a short match knows little of what follows. 256 greedy GSM8K answers
    # guessed at every position from 768 others (2026-12-05, bench/suffix_guesses.py, docs/real-models.md): share
    # 0.5 unbounded laid out 6.3 tokens a position for 0.57 right; 0.3 bounded at 1x 2.9 for 0.62.
    suffix: int = 0
    suffix_ngram: int = 8
    suffix_share: float = 0.3
    suffix_factor: float = 1.0
    # The corpus's continuations as a tree (SuffixDecoding's speculation tree) of at most this many tokens instead of
    # one chain (0: the chain), taken best-first by the share of the tail's matches that reach each, while that share
    # is at least `suffix_tree_prob` (vLLM's `min_token_prob`); `suffix_factor` and `suffix` bound its depth.
    suffix_tree: int = 0
    suffix_tree_prob: float = 0.1
    # At most this many slots a sequence's forward, the root included, the likeliest kept by what such slots were
    # accepted so far in the decode (slot_budget.py: past about six slots each costs this CPU ~0.036 AR steps); 0: no
    # cap. A draft adapter's chain is kept first (nothing verifies it, so nothing counts what it earns), cut only to
    # the window the budget keeps.
    max_slots: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks (K) must be >= 1, got {self.num_blocks}")
        if self.pool_size < 0:
            raise ValueError(f"pool_size must be >= 0, got {self.pool_size}")
        if self.lookup < 0 or self.lookup_ngram < 1:
            raise ValueError(f"lookup must be >= 0 and lookup_ngram >= 1, got {self.lookup}, {self.lookup_ngram}")
        if self.suffix < 0 or not 2 <= self.suffix_ngram <= MAX_NGRAM:
            raise ValueError(
                f"suffix must be >= 0 and suffix_ngram in [2, {MAX_NGRAM}], got {self.suffix}, {self.suffix_ngram}"
            )
        if not 0.0 < self.suffix_share <= 1.0:
            raise ValueError(f"suffix_share must be in (0, 1], got {self.suffix_share}")
        if self.suffix_factor < 0:
            raise ValueError(f"suffix_factor must be >= 0 (0: no bound), got {self.suffix_factor}")
        if self.suffix_tree < 0:
            raise ValueError(f"suffix_tree must be >= 0 (0: one chain), got {self.suffix_tree}")
        if not 0.0 < self.suffix_tree_prob <= 1.0:
            raise ValueError(f"suffix_tree_prob must be in (0, 1], got {self.suffix_tree_prob}")
        if not 0.0 < self.spawn_ratio <= 1.0:
            raise ValueError(f"spawn_ratio (r) must be in (0, 1], got {self.spawn_ratio}")
        if self.max_slots < 0 or self.max_slots == 1:
            raise ValueError(f"max_slots must be 0 (no cap) or >= 2, got {self.max_slots}")
        self.width_policy()  # its own checks

    def describe(self) -> str:
        """`n=64 K=2 pool=4`, and what else differs from plain Jacobi Forcing decoding: seeded drafts, adaptive
        width, a draft chain's span."""
        parts = [f"n={self.block_size}", f"K={self.num_blocks}", f"pool={self.pool_size}"]
        if self.pool_size:
            parts += [f"r={self.spawn_ratio}", *([f"ngram={self.ngram}"] if self.ngram else [])]
        if self.seed_drafts:
            parts.append("seeded")
        if self.adaptive_width:
            parts.append(f"width={self.width_scale}x+{self.width_margin}")
        if self.draft_span:
            parts.append(f"span={self.draft_span}")
        if not self.adapter:
            parts.append("no-adapter")
        if self.lookup:
            parts.append(f"lookup={self.lookup}")
        if self.suffix:
            parts.append(f"suffix={self.suffix}")
            if self.suffix_tree:
                parts.append(f"tree={self.suffix_tree}@{self.suffix_tree_prob}")
        if self.max_slots:
            parts.append(f"slots<={self.max_slots}")
        return " ".join(parts)

    @classmethod
    def check_grid(cls, grid: dict[str, list]) -> None:
        """A tune grid (a profile's `evaluation.tune.grid`): each key a field of this config other than
        `max_new_tokens` (the tune's own), each value one the field takes. Raises ValueError naming the first that
        is not, when the profile is read rather than after training."""
        known = {f.name for f in fields(cls)} - {"max_new_tokens"}
        if unknown := sorted(set(grid) - known):
            raise ValueError(f"unknown decode config field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for name, values in grid.items():
            if not values:
                raise ValueError(f"{name}: no values to try")
            for value in values:
                cls(**{name: value})

    def canonical(self, adapter: bool = True, corpus: bool = True) -> JFDecodeConfig:
        """This config with each knob its other values leave unused at its default, so that two configs that decode
        alike compare equal (the tune grid keeps one). `adapter`: the model drafts with a draft adapter (without one
        a chain's span, and whether to use it, change nothing); `corpus`: it keeps a draft corpus (without one
        suffix drafts are off)."""
        unused = []
        if self.num_blocks == 1:
            unused.append("spawn_ratio")
        if not self.pool_size:
            unused.append("ngram")
        if not self.adaptive_width:
            unused += ["width_scale", "width_margin", "width_floor", "ar_below"]
        if not self.lookup:
            unused.append("lookup_ngram")
        if not self.suffix or not corpus:
            unused += ["suffix", "suffix_ngram", "suffix_share", "suffix_factor", "suffix_tree", "suffix_tree_prob"]
        elif self.suffix_tree:
            unused.append("suffix_share")  # the chain's rule: a tree keeps a token by `suffix_tree_prob`
        else:
            unused.append("suffix_tree_prob")
        if not adapter:
            unused.append("adapter")
        if not adapter or not self.adapter or self.draft_span >= self.block_size - 2:  # the chain stops at n - 2
            unused.append("draft_span")
        defaults = {f.name: f.default for f in fields(JFDecodeConfig)}
        return replace(self, **{name: defaults[name] for name in unused})

    def width_policy(self) -> WidthPolicy | None:
        if not self.adaptive_width:
            return None
        return WidthPolicy(
            scale=self.width_scale, margin=self.width_margin, floor=self.width_floor, ar_below=self.ar_below
        )


@dataclass
class _JFSequence(SequenceState):
    origin: int = 0  # generated position of the window's first token (= len(committed))
    width: RowWidth | None = None  # adaptive width's running estimate
    spawned: int = 0  # pseudo-active blocks opened


class JFDecoder(JacobiDecoder):
    def __init__(
        self,
        model: torch.nn.Module,
        config: JFDecodeConfig,
        *,
        stop: StopTokens,
        recorder: BlockRecorder | None = None,
        on_tokens: TokenSink | None = None,
        sampling: Sampling | None = None,
        clock: NoClock = NO_CLOCK,
    ) -> None:
        if recorder is not None:
            raise ValueError("a BlockRecorder needs plain Jacobi decoding (JacobiConfig), not multi-block/recycling")
        super().__init__(model, config, stop=stop, on_tokens=on_tokens, sampling=sampling, clock=clock)
        self.cfg = config
        self.spawn_at = math.ceil(config.spawn_ratio * config.block_size)
        self.policy = config.width_policy()
        self.limit = 0  # the slots every row may run in the next forward (adaptive width); 0: no limit
        # One budget for the decode: every row's slots teach it what such slots earn on this text.
        self.budget = SlotBudget(config.max_slots) if config.max_slots else None

    def new_sequence(self, index: int, prompt: list[int]) -> _JFSequence:
        seq = super().new_sequence(index, prompt)
        width = RowWidth(self.policy.initial) if self.policy else None
        return _JFSequence(**{f: getattr(seq, f) for f in seq.__dataclass_fields__}, width=width)

    def plan(self, kv: KVState, active: list[_JFSequence]) -> None:
        """Adaptive width: the slots every row may run in the next forward. The batch's forward is padded to one
        width and computed in full, so all rows share it: the mean of what the rows want. The widest row's want
        let one predictable row make the whole batch pay (measured slower than the mean at batch 4 and 16 on the
        embedded model)."""
        if self.policy is not None:
            wanted = [seq.width.wanted(self.policy) for seq in active]
            self.limit = math.ceil(sum(wanted) / len(wanted))

    def _proposed(self, seq: SequenceState) -> Layout:
        lay = super()._proposed(seq)
        return lay if self.budget is None else self.budget.cut(lay)

    def room(self, seq: _JFSequence) -> Room:
        """The next forward runs the whole window, or through the first EOS of its draft, and no more than the
        batch's slot limit; branches cover the real-active block's remaining positions at most (beyond it they would
        compete with pseudo-active drafts that condition on more context)."""
        window = seq.window
        end = first_eos(window, self.eos, start=1) if self.cfg.cut_at_draft_eos else None
        run = end + 1 if end is not None else len(window)
        run = min(run, self.limit) if self.limit else run
        return Room(run=run, window=len(window), block_left=self._block_end(seq) - seq.origin)

    def settle(self, seq: _JFSequence, layout: Layout, greedy: list[int], branch: int, accepted: int) -> None:
        if self.budget is not None:
            self.budget.observe(layout, greedy)
        main = layout.branches[0]
        win = layout.branches[branch]
        window = seq.window  # its first len(main) tokens were run, as the row's first slots
        main_greedy = greedy[: len(main)]
        win_tokens = [layout.tokens[i] for i in win]
        win_greedy = [greedy[i] for i in win]
        won = next(p for p in self.proposers if p.name == layout.owners[branch]) if branch else None
        if won is not None:
            seq.wins[won.name] += 1
        if seq.width is not None:
            # A branch whose guess earns by its own length (a lookup's) says nothing of what the window's drafts
            # earn: the width then follows the window's own count.
            speaks = won is None or won.speaks_for_the_window
            own = accepted if speaks else accepted_length(window[: len(main)], main_greedy)
            seq.width.observe(self.policy, len(main), own)
        seq.stats.forwards += 1
        seq.stats.accepted.append(accepted)
        seq.committed += win_tokens[:accepted]
        seq.origin += accepted
        if accepted == len(window):
            self._open_block(seq, win_greedy[-1])
            seq.origin = len(seq.committed)
            self._spawn(seq, previous=[], previous_origin=seq.origin)
            return
        # Window position p (>= accepted) gets the argmax after position p - 1, from the winning branch where it
        # reaches, else from the window's own forward (the Jacobi update; pseudo-active blocks are refined the
        # same way); a position past the run (after a draft EOS) keeps its draft.
        seq.window = [
            win_greedy[p - 1] if p - 1 < len(win_tokens) else main_greedy[p - 1] if p - 1 < len(main) else window[p]
            for p in range(accepted, len(window))
        ]
        if self._check_done(seq):
            return
        self._spawn(seq, previous=window, previous_origin=seq.origin - accepted)

    def _block_end(self, seq: _JFSequence) -> int:
        n = self.cfg.block_size
        return min((seq.origin // n + 1) * n, self.cfg.max_new_tokens)

    def _spawn(self, seq: _JFSequence, previous: list[int], previous_origin: int) -> None:
        """Append a pseudo-active block when the newest one has settled enough and fewer than K are in flight."""
        n, limit = self.cfg.block_size, self.cfg.max_new_tokens
        if seq.done:
            return
        end = seq.origin + len(seq.window)
        if end >= limit:
            return
        real, newest = seq.origin // n, (end - 1) // n
        if newest - real + 1 >= self.cfg.num_blocks:
            return
        if seq.width is not None and len(seq.window) >= seq.width.wanted(self.policy):
            return  # the next forward would not run the new block's slots: its draft would only go stale
        if newest == real:
            settled = seq.origin - real * n
        else:
            start = newest * n
            settled = 0
            for pos in range(start, end):
                old = pos - previous_origin
                if 0 <= old < len(previous) and previous[old] == seq.window[pos - seq.origin]:
                    settled += 1
                else:
                    break
        if settled < min(self.spawn_at, end - newest * n):
            return
        length = min(n, limit - end)
        seq.window = seq.window + self.new_draft(seq, seq.prompt + seq.committed + seq.window, length)
        seq.spawned += 1


def jf_decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JFDecodeConfig,
    *,
    stop: StopTokens,
    on_tokens: TokenSink | None = None,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
) -> DecodeOutput:
    decoder = JFDecoder(model, config, stop=stop, on_tokens=on_tokens, sampling=sampling)
    return decoder.decode(prompts, seeds)
