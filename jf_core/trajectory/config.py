"""The profile's `trajectory` section: how a round's trajectories are made, as data (the collector's settings and
the store's shard size). `jf_core.config` composes it into the profile; kept apart from collect.py so that reading
a profile imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from jf_core.trajectory.collect import CollectConfig


class TrajectoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    seed: int = 0
    batch_size: int = Field(16, ge=1)
    shard_size: int = Field(64, ge=1)  # prompts per shard: the unit of work, retry and resume
    draft_init: Literal["prompt_sample", "repeat_last", "random_vocab"] = "prompt_sample"
    round_id: str = "round-0"
    # jacobi: every block's states recorded by Jacobi decoding; synthetic: the fixed points from greedy AR (batched,
    # far cheaper) and each block's states made by corrupting its tail with `corruption` noise, as upstream's
    # masking-based first round does (jf_core/trajectory/synthetic.py); text: the same, on the prompt file's
    # reference answers (`prompts.answer_field`) instead of greedy AR's: no forward at all. Same records, `kind` on
    # each row.
    kind: Literal["jacobi", "synthetic", "text"] = "jacobi"
    corruption: Literal["context", "vocab"] = "context"

    def collect_config(self) -> CollectConfig:
        """The collector's settings (collect.py); the shard size is the store's."""
        from jf_core.trajectory.collect import CollectConfig

        return CollectConfig(**self.model_dump(exclude={"shard_size"}))
