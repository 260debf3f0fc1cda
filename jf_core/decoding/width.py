"""How wide each forward's window runs: as wide as a row is likely to accept, plus a margin.

On hardware whose forward cost grows with the window (any CPU; a GPU once batch x width passes its roofline knee),
every slot run past what will be accepted is paid for: on the embedded model at batch 1 a 64-slot forward costs
2.8x a 1-slot one, and a row that accepts 7 tokens a forward gains nothing from its 60th slot. The policy keeps a
running estimate of each row's accepted tokens per forward (an exponential mean) and runs
`ceil(scale * estimate) + margin` slots, never fewer than `floor`. Slots past the run keep their drafts (the
decoder treats them like the positions after a draft EOS), so verification, and therefore the output, is unchanged:
the policy trades only speed.

A row whose estimate falls below `ar_below` tokens per forward runs single-slot forwards (AR steps inside the
batch), with a probe at `floor` width every `probe_every` forwards to notice when its text turns predictable again.
Only forwards wider than one slot update the estimate: an AR step says nothing about what a draft would do.

A batch's forward is padded to one width and computed in full (every attention path here computes the padded
window), so the rows share one width: the mean of what they want (multiblock.JFDecoder.plan). A row wanting less
fills the shared width for free (and a row on AR steps gets a free probe); a row wanting more is cut, rather than
the whole batch paying for its slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WidthPolicy:
    scale: float = 1.5  # slots per expected accepted token
    margin: int = 4  # slots beyond scale x estimate
    floor: int = 4  # the narrowest window a Jacobi row runs (AR steps aside)
    decay: float = 0.5  # weight of the newest forward in the running estimate
    initial: float = 4.0  # the estimate before a row's first forward
    ar_below: float = 0.0  # estimate below which a row runs AR steps; 0 never
    probe_every: int = 8  # a row on AR steps runs one floor-width forward this often

    def __post_init__(self) -> None:
        if self.scale <= 0 or self.margin < 0 or self.floor < 1:
            raise ValueError(f"width policy: scale > 0, margin >= 0 and floor >= 1 needed, got {self}")
        if not 0 < self.decay <= 1 or self.initial <= 0 or self.probe_every < 1:
            raise ValueError(f"width policy: decay in (0, 1], initial > 0 and probe_every >= 1 needed, got {self}")


@dataclass
class RowWidth:
    """One row's running estimate and where it stands in the AR-step cycle."""

    estimate: float
    ar_steps: int = 0

    def wanted(self, policy: WidthPolicy) -> int:
        if self.estimate < policy.ar_below:
            return policy.floor if self.ar_steps % policy.probe_every == policy.probe_every - 1 else 1
        return max(policy.floor, math.ceil(policy.scale * self.estimate) + policy.margin)

    def observe(self, policy: WidthPolicy, run: int, accepted: int) -> None:
        if run == 1:
            self.ar_steps += 1
            return
        self.ar_steps = 0
        self.estimate = (1 - policy.decay) * self.estimate + policy.decay * accepted
