"""How an experiment measures a model: plain Jacobi against our AR on the questions it trained on and on held-out
ones, in fp32 (run.py's docstring says what each figure is and why they stand side by side)."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from jf_core.round.results import StageResult

if TYPE_CHECKING:
    from jf_core.decoding import JFDecodeConfig

Score = Callable[[list[int], dict], bool]  # (an answer's new tokens, its question's row) -> correct


class SetFigures(BaseModel):
    """One model on one question set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tpf: float  # plain Jacobi's at the measurement's first block size
    identical_to_own_ar: float  # every block size's outputs against greedy AR: the lowest share
    identical_to_base: float
    repetition: float
    mean_length: float
    # How far the text stays the input model's before it departs: the median tokens in common from the start (an
    # unchanged answer counts its whole length). "= base" alone is all or nothing.
    base_prefix: float = 0.0
    accuracy: float | None = None  # the answers scored against the questions' rows (None: not scored)
    outputs: list[list[int]] = []  # greedy AR's new tokens, per question
    tpf_by_block_size: dict[str, float] = {}  # plain Jacobi's at every block size measured (more than one)
    tpf_multiblock: float | None = None  # two blocks in flight (K = 2) at the first block size, where measured
    tpf_by_layout: dict[str, float] = {}  # each named decode layout's (`Measure.layouts`), where measured


class Measured(StageResult):
    """The measurement stage: one model on both question sets."""

    trained: SetFigures
    held_out: SetFigures


@dataclass(frozen=True)
class Questions:
    """A question set, tokenized as the prompts are, with each question's row to score its answer by (None: the
    set is not scored)."""

    prompts: list[list[int]]
    references: list[dict] | None = None


@dataclass(frozen=True)
class Measure:
    """How every model of an experiment is measured (see the module docstring); `score(answer tokens, row)` scores
    a set that has references."""

    trained: Questions
    held_out: Questions
    block_size: int
    max_new_tokens: int
    batch_size: int = 4
    draft_init: str = "prompt_sample"
    score: Score | None = None
    more_block_sizes: tuple[int, ...] = ()  # plain Jacobi at these too (`SetFigures.tpf_by_block_size`)
    multiblock: bool = False  # K = 2 at `block_size` too, no recycling (`SetFigures.tpf_multiblock`)
    # Named decode layouts measured too (`SetFigures.tpf_by_layout`): the layout a decoder deploys (a tune's
    # winner: n, adaptive width, the draft chain's span, prompt lookup) is what training must pay in, and plain
    # Jacobi's TPF at n does not say how an adapter drafts in a 1-slot chain.
    layouts: tuple[tuple[str, JFDecodeConfig], ...] = ()

    @property
    def block_sizes(self) -> list[int]:
        return list(dict.fromkeys((self.block_size, *self.more_block_sizes)))

    def key(self) -> str:
        """What the figures depend on (the batch size changes no output and no TPF)."""
        what = {
            "sets": [(q.prompts, q.references) for q in (self.trained, self.held_out)],
            "scored": self.score is not None,
            "block_size": self.block_size,
            "max_new_tokens": self.max_new_tokens,
            "draft_init": self.draft_init,
        }
        if len(self.block_sizes) > 1:  # a measurement of one size keeps the key it had before sizes were added
            what["block_sizes"] = self.block_sizes
        if self.multiblock:  # likewise for one without K = 2
            what["multiblock"] = True
        if self.layouts:  # and for one without layouts
            what["layouts"] = [(name, repr(cfg)) for name, cfg in self.layouts]
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def model(self, model_path: str, device: str, base: Measured | None) -> Measured:
        """The model at `model_path` decoded in fp32 on `device`, each set's text against the input model's
        (`base`; None: this is the input model)."""
        import torch

        from jf_core.models import load_model, stop_tokens

        model, tok = load_model(model_path, dtype="float32", device=device)
        stop = stop_tokens(model, tok)
        with torch.no_grad():
            trained = self._set(model, stop, self.trained, base.trained.outputs if base else None)
            held = self._set(model, stop, self.held_out, base.held_out.outputs if base else None)
        return Measured(trained=trained, held_out=held)

    def _set(self, model, stop, questions: Questions, base_outputs: list[list[int]] | None) -> SetFigures:
        from jf_core.evaluation.degeneracy import output_stats
        from jf_core.evaluation.method import AR, MULTIBLOCK, Method, jacobi
        from jf_core.evaluation.methods import build_methods
        from jf_core.evaluation.speed import bench, first_divergence

        n, new = self.block_size, self.max_new_tokens
        methods = build_methods(
            model, stop, new, block_sizes=self.block_sizes, draft_init=self.draft_init,
            variants_at=n if self.multiblock else None, variant_kinds=(MULTIBLOCK.kind,),
        )  # fmt: skip
        # A layout's row is the `tuned` kind tagged by the layout's name (its label: `NAME_tuned`).
        for name, cfg in self.layouts:
            methods |= build_methods(model, stop, new, ar=False, tuned=cfg, model_tag=name)
        refs, score = questions.references, self.score
        scorer = None if score is None or refs is None else (lambda i, seq: score(list(seq), refs[i]))
        rows = bench(methods, questions.prompts, batch_size=self.batch_size, warmup_prompts=0, reference=None,
                     scorer=scorer, keep_outputs=True)  # fmt: skip
        by_method = {r.method: r for r in rows}
        ar, plain = by_method[AR], {size: by_method[jacobi(size)] for size in self.block_sizes}
        multi = by_method.get(MULTIBLOCK)
        layouts = {name: by_method[Method("tuned", model=name)] for name, _ in self.layouts}
        parallel = [*plain.values(), *([multi] if multi else []), *layouts.values()]  # each must give AR's text
        outputs = ar.outputs
        base = base_outputs if base_outputs is not None else outputs
        kept = [len(a) if (d := first_divergence(b, a)) is None else d for a, b in zip(outputs, base, strict=True)]
        stats = output_stats(outputs, new, stop.eos)
        return SetFigures(
            tpf=plain[n].tpf,
            identical_to_own_ar=min(r.identical_fraction for r in parallel),
            identical_to_base=sum(a == b for a, b in zip(outputs, base, strict=True)) / len(outputs),
            repetition=stats["repetition"],
            mean_length=stats["mean_length"],
            base_prefix=float(statistics.median(kept)),
            accuracy=ar.accuracy,
            outputs=outputs,
            tpf_by_block_size={str(size): r.tpf for size, r in plain.items()} if len(plain) > 1 else {},
            tpf_multiblock=multi.tpf if multi else None,
            tpf_by_layout={name: r.tpf for name, r in layouts.items()},
        )
