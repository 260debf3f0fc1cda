"""On-policy draft states: while training, the model decodes some of its own training prompts with the Jacobi
decoder, and the states it visits join those blocks' pools of states (`PackedExample.states`).

Why: packed trajectories hold the states of the model that collected them (the base model). The model being trained
iterates differently, so at decode time it meets states it was never trained on; upstream regenerates trajectories
with the trained model between progressive rounds, and this does it every `training.onpolicy_every` steps inside
one run. States are only added where they are valid training inputs: block j's states join example block j only
when the decode reproduced every fixed point up to and including j (the same context, the same target). Added
states are drawn from when the example is next seen (`training.state_pick: each_visit`, jf_data.jf_batches).

The decode also measures the TPF the model reaches on its training prompts so far (`onpolicy_tpf`): the
mechanism's own signal, free with the states.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from jf_core.decoding import JacobiConfig, StopTokens
from jf_core.decoding.backends import decoding_attention
from jf_core.decoding.jacobi import BlockStates, JacobiDecoder
from jf_core.training.packing import PackedExample


class OnPolicyStates:
    """Called with the model (in eval mode) every `onpolicy_every` steps: decodes the next `prompts` examples of
    `examples` (in turn, wrapping around) and adds the states it visited to their blocks' pools, in place."""

    def __init__(
        self,
        examples: Sequence[PackedExample],
        *,
        prompts: int,
        stop: StopTokens,
        seed: int = 0,
        draft_init: str = "prompt_sample",
        batch_size: int = 4,
    ) -> None:
        if not examples:
            raise ValueError("on-policy states need packed examples to decode")
        self.examples = examples
        self.prompts = max(1, min(prompts, len(examples)))
        self.stop = stop
        self.seed = seed
        self.draft_init = draft_init
        self.batch_size = batch_size
        self.next = 0

    def _chosen(self) -> list[PackedExample]:
        picked = [self.examples[(self.next + i) % len(self.examples)] for i in range(self.prompts)]
        self.next = (self.next + self.prompts) % len(self.examples)
        return picked

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        chosen = self._chosen()
        added = matched = blocks = forwards = tokens = 0
        for first in range(0, len(chosen), self.batch_size):
            batch = chosen[first : first + self.batch_size]
            n = batch[0].n
            cfg = JacobiConfig(
                block_size=n,
                max_new_tokens=max(e.num_blocks for e in batch) * n,
                draft_init=self.draft_init,  # type: ignore[arg-type]
                seed=self.seed,
            )
            recorder = BlockStates()
            with torch.no_grad(), decoding_attention(model):
                out = JacobiDecoder(model, cfg, stop=self.stop, recorder=recorder).decode([e.prompt for e in batch])
            forwards += out.stats.forwards
            tokens += out.stats.new_tokens
            for row, example in enumerate(batch):
                blocks += example.num_blocks
                for j in range(example.num_blocks):
                    fixed = recorder.fixed.get((row, j))
                    if fixed is None or fixed != (example.clean[j], example.lengths[j]):
                        break  # the text left the packed one here: later blocks have another context
                    matched += 1
                    pool = example.states[j]
                    known = {tuple(s) for s in pool}
                    for state in recorder.states[(row, j)]:
                        if tuple(state) not in known:
                            known.add(tuple(state))
                            pool.insert(len(pool) - 1, state)  # the fixed point stays last
                            added += 1
        return {
            "onpolicy_tpf": tokens / max(forwards, 1),
            "onpolicy_blocks_matched": matched / max(blocks, 1),
            "onpolicy_states_added": float(added),
        }
