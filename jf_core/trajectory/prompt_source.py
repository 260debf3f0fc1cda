"""The profile's `prompts` section: where a round's prompts come from and how they are rendered, as data. Kept apart
from prompts.py (the readers) so that reading a profile imports no reader."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

# Held-out questions fall in two fixed halves by a salted hash of their text (prompts.held_out_slice): decisions (a
# recipe's held-out probe, a layout study, training's held-out TPF probe) read the development half, reported figures
# (a round's evaluation, `jf bench decode`) the confirmation half, so no reported figure is on a question a decision
# was made on. The embedded task's halves are its own splits: calib (development) and test (confirmation).
HeldOutSlice = Literal["development", "confirmation"]


class PromptSourceConfig(BaseModel):
    source: str = "embedded"  # path (.jsonl, .jsonl.gz, .parquet, datasets dir), hub id, or "embedded"
    split: str = "train"
    text_field: str = "prompt"
    messages_field: str | None = None  # e.g. "messages": a list of {"role", "content"}
    id_field: str | None = None  # default: the row number
    chat_template: bool | None = None  # None: apply when the tokenizer has one
    system_prompt: str | None = None
    min_prompt_tokens: int = Field(1, ge=1)
    max_prompt_tokens: int | None = Field(None, ge=1)
    limit: int | None = Field(None, ge=1)
    # Prompt files merged after the source (`jf prompts add`, an event-triggered round): same fields, read whole
    # (`limit` bounds the source only), their prompt ids prefixed with the file's name.
    extra_sources: list[str] = Field(default_factory=list)
    # A file with no splits of its own (e.g. GSM8K's test set) split by a hash of each row's text: {name: fraction}
    # in order, e.g. {train: 0.8, calib: 0.05, test: 0.15}; `split` picks one. The same text lands in the same split
    # whatever the file's order, so a benchmark over the same file (evaluation.split) holds out exactly the rest.
    hash_splits: dict[str, float] | None = None
    # More questions of the same kind: the `train` split also yields this many variants of each row, its integers
    # replaced by others of as many digits (the same one wherever a number recurs), seeded by the row. Trajectories
    # need no reference answer (a block's fixed point is the model's own greedy text), so a variant is as good a
    # training prompt as its source; it inherits its source's split, so no held-out question's variant is trained
    # on. `limit` counts variants too. Text fields only.
    number_variants: int = Field(0, ge=0)
    # Each row's reference answer (GSM8K: `answer`): the text `trajectory.kind: text` trains on, read with the prompt
    # (a row without one is skipped as `no_answer`). None: prompts only.
    answer_field: str | None = None
    # Held-out reading only (`held_out_source`): the rows in this half of the held-out questions (HeldOutSlice).
    held_out_slice: HeldOutSlice | None = None

    @model_validator(mode="after")
    def _variants_of_text(self) -> PromptSourceConfig:
        if self.number_variants and self.messages_field is not None:
            raise ValueError("prompts.number_variants rewrites a text field; this source gives chat messages")
        if self.number_variants and self.answer_field is not None:
            raise ValueError(
                "prompts.number_variants writes questions with new numbers, whose answers are not in the file: "
                "drop number_variants, or answer_field"
            )
        return self

    @field_validator("hash_splits")
    @classmethod
    def _fractions(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value or any(f <= 0 for f in value.values()) or abs(sum(value.values()) - 1.0) > 1e-6:
            raise ValueError(f"hash_splits must be positive fractions summing to 1, got {value}")
        return value

    def identity(self, *, exclude: set[str] = frozenset()) -> dict:
        """This config as cache keys see it: fields added after keys existed (extra_sources, hash_splits,
        number_variants, answer_field) only while they are set, so the keys of profiles that do not use them are
        unchanged."""
        data = self.model_dump(exclude=set(exclude))
        for name in ("extra_sources", "hash_splits", "number_variants", "answer_field", "held_out_slice"):
            if name in data and not data[name]:
                del data[name]
        return data


def held_out_whole(prompts: PromptSourceConfig, source: str | None) -> bool:
    """Whether the held-out `source` is read whole: it names another file than the prompts' (GSM8K's test split
    beside its train split: the dataset's own split, no hash). Else the prompt file's held-out hash split is."""
    return bool(source) and source != prompts.source
