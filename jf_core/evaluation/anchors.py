"""The rows a trained model's evaluation is held to, timed beside its own in the same run: its untrained anchors
(the input model decoded by what a user would pick instead of training: HF prompt lookup, our decoder with the config
the same tune found on it) and, for a model with a draft adapter, its own decoding without the adapter (the input
model with the trained model's draft corpus and tuned config). Each row's greedy reference is the input model's AR."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jf_core.config import EvalConfig
from jf_core.decoding import JacobiConfig
from jf_core.evaluation.method import AR, NO_ADAPTER, UNTRAINED, Method
from jf_core.evaluation.methods import build_methods
from jf_core.evaluation.speed import Decoder


@dataclass(frozen=True)
class Untrained:
    """The untrained anchors of a trained model's evaluation: the model it was trained from (the round's input) and
    the decode config the same tune found on that model, with the batch size above which its dispatch runs AR
    (None, None: the tune is off, and prompt lookup is the only anchor)."""

    model_path: str
    tuned: JacobiConfig | None = None
    ar_above_batch: int | None = None


def untrained_methods(
    untrained: Untrained, cfg: EvalConfig, decode_kwargs: dict
) -> tuple[dict[Method, Decoder], dict[Method, Method]]:
    """The anchors' rows (`base_ar`, `base_hf_prompt_lookup`, `base_tuned`; the input model's plain Jacobi too where
    the evaluation reads the input model's own figures from them, `EvalConfig.reads_input_model`) and, for each, the
    greedy reference its output must equal: the input model's own AR."""
    how = {
        "prompt_lookup": True,
        "tuned": untrained.tuned,
        "ar_above_batch": untrained.ar_above_batch,
        "block_sizes": cfg.block_sizes if cfg.reads_input_model else (),
    }
    return _input_model_rows(untrained, cfg, decode_kwargs, UNTRAINED, **how)


def no_adapter_methods(
    untrained: Untrained,
    trained: torch.nn.Module,
    tuned: JacobiConfig | None,
    ar_above_batch: int | None,
    cfg: EvalConfig,
    decode_kwargs: dict,
) -> tuple[dict[Method, Decoder], dict[Method, Method]]:
    """Where the trained model drafts with an adapter and has a tuned config: its decoding without the adapter, the
    `no_adapter_tuned` row (the input model with the trained model's draft corpus, the same config and crossover),
    and its greedy reference, the input model's AR. A round's model keeps both an adapter and a corpus made from
    the same trajectories; this row says which of the two its speed comes from. Empty where there is no adapter,
    and where the tuned config already leaves it out: the row would decode exactly as the headline does; timing the
    same decoding twice printed a ratio that differed from 1 by the timer alone (0.95x), and with it gone the
    smollm2-135m round's evaluation took 11.4 minutes instead of 12.3 (2026-12-06)."""
    from jf_core.decoding.proposers.suffix import draft_corpus
    from jf_core.draft_adapter.adapter import draft_adapter

    if tuned is None or draft_adapter(trained) is None or not tuned.adapter:
        return {}, {}
    how = {"ar": False, "tuned": tuned, "ar_above_batch": ar_above_batch}
    return _input_model_rows(untrained, cfg, decode_kwargs, NO_ADAPTER, corpus=draft_corpus(trained), **how)


def _input_model_rows(
    untrained: Untrained, cfg: EvalConfig, decode_kwargs: dict, tag: str, corpus=None, **how
) -> tuple[dict[Method, Decoder], dict[Method, Method]]:
    """`build_methods(**how)` on a load of the input model of its own (with `corpus` attached, where given: a corpus
    is kept on the model, and the anchors decode without the trained model's), its rows tagged `tag`, each row's
    greedy reference the input model's AR."""
    from jf_core.decoding.proposers.suffix import attach_corpus
    from jf_core.models import load_model, stop_tokens

    model, tok = load_model(untrained.model_path, **decode_kwargs)
    if corpus is not None:
        attach_corpus(model, corpus)
    rows = build_methods(model, stop_tokens(model, tok), cfg.max_new_tokens, model_tag=tag, **how)
    return rows, dict.fromkeys(rows, AR.of(UNTRAINED))
