"""What a table row is: a decoding method's identity as typed fields (whose model, which kind, which block size),
and the one place its label is written (`Method.label`). Builders key their decoders by `Method`, rows carry it,
readers ask by it (`Evaluation.row(jacobi(16))`) or read its fields (the plots): a label is written for people and
JSON keys, and nothing reads one back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MethodKind = Literal[
    "hf_generate",  # HF's greedy search
    "hf_prompt_lookup",  # HF's prompt lookup decoding (batch 1)
    "ar",  # our AR: every speedup's baseline and every greedy method's reference
    "ar_control",  # our AR again, timed as one more method: its ratio to AR is the timer's bias and spread
    "jacobi",  # plain Jacobi at `block_size`
    "lookup",  # Jacobi at `block_size` with prompt lookup's guess verified beside the window (one block, no pool)
    "recycling",  # Jacobi Forcing decoding: rejection recycling with seeded drafts
    "multiblock",  # two blocks in flight
    "recycling_multiblock",  # both
    "tuned",  # the model's stored decode config, dispatched by its stored crossover
    "autotuned",  # the same for a second model in a bench (the trained model beside a base)
]

# The tag of the untrained anchors' rows in a trained model's evaluation: the round's input model (the base, in a
# first round) decoded by what a user would pick instead of training (HF prompt lookup, our decoder tuned on it).
UNTRAINED = "base"
# The kinds an untrained anchor row may have: the best of them is what training has to beat.
ANCHOR_KINDS = ("hf_prompt_lookup", "tuned")
# The tag of a trained model's decoding without its draft adapter: the input model with the trained model's draft
# corpus, decoded by the trained model's tuned config. The trained row over it is what the adapter adds; it over the
# untrained anchors, what the corpus (and the trained model's tune) adds. Not an anchor: a round keeps its corpus.
NO_ADAPTER = "no_adapter"

_HF = ("hf_generate", "hf_prompt_lookup")
_SIZED = ("jacobi", "lookup")  # the kinds a row's block size names


@dataclass(frozen=True)
class Method:
    kind: MethodKind
    block_size: int | None = None  # plain Jacobi's and lookup's n; the other kinds' widths are their decode configs'
    model: str | None = None  # None: the model under evaluation; else a second model's tag ("jf": the trained one)
    full_width: bool = False  # a tuned config with its adaptive width turned off (what adaptive width brings)

    def __post_init__(self) -> None:
        if (self.kind in _SIZED) != (self.block_size is not None):
            raise ValueError(f"method {self.kind}: a block size is plain Jacobi's and lookup's, and only theirs")
        if self.full_width and self.kind not in ("tuned", "autotuned"):
            raise ValueError(f"method {self.kind}: full_width applies to a tuned config")
        if self.model is not None and not self.model.isidentifier():
            raise ValueError(f"method model tag {self.model!r}: letters, digits and underscores")

    @property
    def label(self) -> str:
        """The row's name in tables, JSON keys and MLflow metrics (`jacobi_n16`, `jf_ar`, `tuned_full_width`)."""
        name = f"{self.kind}_n{self.block_size}" if self.kind in _SIZED else self.kind
        lead = f"{self.model}_" if self.model else ""
        return f"{lead}{name}{'_full_width' if self.full_width else ''}"

    @property
    def ours(self) -> bool:
        """One of the project's decoders (the fp32 contract covers it); HF's methods are rows to compare with."""
        return self.kind not in _HF

    def of(self, model: str | None) -> Method:
        """The same method on another model's row."""
        return Method(self.kind, self.block_size, model, self.full_width)

    def __str__(self) -> str:
        return self.label


AR = Method("ar")
AR_CONTROL = Method("ar_control")
TUNED = Method("tuned")
HF_GENERATE = Method("hf_generate")
HF_PROMPT_LOOKUP = Method("hf_prompt_lookup")
MULTIBLOCK = Method("multiblock")


def jacobi(n: int, model: str | None = None) -> Method:
    return Method("jacobi", block_size=n, model=model)
