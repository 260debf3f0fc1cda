"""The methods an evaluation or a bench runs, built in one place (`build_methods`): each a `Decoder` (a batch of
prompts -> a DecodeOutput) keyed by its `Method` (method.py), the identity its table row has. The round's
evaluation, `jf eval` and `jf bench decode` all build theirs here: our AR (every speedup's baseline and every greedy
method's reference), plain Jacobi at each block size, the model's tuned config, and for the bench HF `generate` and
prompt lookup, and a trained model's recycling and multi-block rows beside its own AR.

HF methods are greedy and nothing else (`greedy_generation_config`), wrapped to the project's decoder interface;
their forwards are counted by a hook, so their TPF is measured, not assumed.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Literal

import torch

from jf_core.decoding import DecodeOutput, JacobiConfig, JFDecodeConfig, Sampling, StopTokens, ar_decode, decode
from jf_core.decoding.common import finish, left_pad
from jf_core.decoding.draft import DraftInitName
from jf_core.decoding.stats import DecodeStats, SequenceStats, Timer
from jf_core.evaluation.method import AR, HF_GENERATE, HF_PROMPT_LOOKUP, Method, jacobi
from jf_core.evaluation.speed import Decoder


class ForwardCounter:
    """Counts `model.forward` calls (one per decoding step of HF generate, prefill included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


@contextlib.contextmanager
def _pristine_generation_config(model) -> Iterator[None]:
    """transformers fills every field a passed GenerationConfig leaves unset from the checkpoint's
    generation_config.json (Qwen instruct ships repetition_penalty 1.05, top_k, top_p, ...): during the call the
    model's own config is a blank one, so nothing but what we pass applies."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def greedy_generation_config(stop: StopTokens, max_new_tokens: int, **extra):
    """Plain greedy search, explicitly: no penalties, no sampling knobs, every EOS id."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=sorted(stop.eos) or None,
        pad_token_id=stop.pad,
        **extra,
    )


def hf_generate_decoder(
    model, stop: StopTokens, max_new_tokens: int, *, batched: bool = True, **generate_kwargs
) -> Decoder:
    """HF `generate`, greedy and nothing else (`greedy_generation_config`), wrapped to the project's decoder
    interface: left-padded batches like our decoders, or one call per prompt for methods that only run at batch 1
    (prompt lookup: `batched=False`). Forwards are counted by a hook; a sequence's TPF counts the batch forwards it
    took part in (through its EOS)."""
    eos = stop.eos
    gen_config = greedy_generation_config(stop, max_new_tokens, **generate_kwargs)

    def run(prompts: list[list[int]]) -> tuple[list[list[int]], int]:
        ids, mask = left_pad(prompts, stop.pad, model.device)
        counter = ForwardCounter(model)
        with _pristine_generation_config(model):
            try:
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config)
            finally:
                counter.close()
        return out[:, ids.shape[1] :].tolist(), counter.count

    def decode(prompts: list[list[int]]) -> DecodeOutput:
        timer = Timer(model.device)
        start = timer.now()
        groups = [prompts] if batched else [[p] for p in prompts]
        seqs, stats = [], []
        for group in groups:
            rows, forwards = run(group)
            for row in rows:
                tokens, _ = finish(row, eos, max_new_tokens)
                seqs.append(tokens)
                # At batch 1 the hook counts this sequence's forwards; in a batch, one per token it generated.
                taken = forwards if len(group) == 1 else len(tokens)
                stats.append(SequenceStats(new_tokens=len(tokens), forwards=taken))
        return DecodeOutput(seqs, DecodeStats(stats, decode_seconds=timer.now() - start, prefill_timed=False))

    return decode


def prompt_seeds(prompts: Sequence[Sequence[int]]) -> list[int]:
    """A sampling seed per prompt from its tokens: the same whichever method or batch decodes it."""
    return [zlib.crc32(",".join(map(str, p)).encode()) for p in prompts]


# Jacobi Forcing's decoding variants `build_methods` adds at one block size, in table order.
VARIANT_KINDS = ("recycling", "multiblock", "recycling_multiblock")


def build_methods(
    model: torch.nn.Module,
    stop: StopTokens,
    max_new_tokens: int,
    *,
    ar: bool = True,
    block_sizes: Sequence[int] = (),
    lookup_sizes: Sequence[int] = (),
    variants_at: int | None = None,
    tuned: JacobiConfig | None = None,
    tuned_kind: Literal["tuned", "autotuned"] = "tuned",
    full_width: bool = False,
    ar_above_batch: int | None = None,
    sampling: Sampling | None = None,
    hf: bool = False,
    prompt_lookup: bool = False,
    prompt_lookup_tokens: int = 10,
    model_tag: str | None = None,
    draft_init: DraftInitName = "prompt_sample",
    variant_kinds: Sequence[str] = VARIANT_KINDS,
) -> dict[Method, Decoder]:
    """One model's methods, in table order, each its `Method` on `model_tag`'s rows (a second model's: "jf"):

    - `hf_generate`, `hf_prompt_lookup` (with `hf`; `prompt_lookup`: that row alone): HF's greedy search, and its
      prompt lookup (batch 1 only);
    - `ar` (unless `ar` is False): our AR, the baseline;
    - `jacobi` at each of `block_sizes`: plain Jacobi;
    - `lookup` at each of `lookup_sizes`: Jacobi with prompt lookup's guess verified beside the window
      (jf_core/decoding/proposers/prompt_lookup.py; one block, no recycling pool);
    - `recycling`, `multiblock`, `recycling_multiblock` (with `variants_at` = n, those in `variant_kinds`): rejection
      recycling with seeded drafts, two blocks in flight, and both, at n;
    - `tuned_kind` (with `tuned`): the model's tuned config, the model's default decode path: above
      `ar_above_batch` (its stored crossover) it runs AR; with `full_width` and an adaptive-width config, also
      the same config at full width (what adaptive width brings).

    With `sampling` every row but HF's samples, each prompt with a seed of its own tokens (the same in every method
    and batch), so "identical" checks that sampled decoding is lossless. `draft_init`: how plain Jacobi's rows draft
    a block first (an experiment drafts as its trajectories were collected)."""

    def seeds(prompts: list[list[int]]) -> list[int] | None:
        return prompt_seeds(prompts) if sampling else None

    def run(cfg: JacobiConfig, above: int | None = None) -> Decoder:
        return lambda ps: decode(model, ps, cfg, stop=stop, sampling=sampling, seeds=seeds(ps), ar_above_batch=above)

    methods: dict[Method, Decoder] = {}
    if hf:
        methods[HF_GENERATE.of(model_tag)] = hf_generate_decoder(model, stop, max_new_tokens)
    if hf or prompt_lookup:
        methods[HF_PROMPT_LOOKUP.of(model_tag)] = hf_generate_decoder(
            model, stop, max_new_tokens, batched=False, prompt_lookup_num_tokens=prompt_lookup_tokens
        )
    if ar:
        methods[AR.of(model_tag)] = lambda ps: ar_decode(
            model, ps, max_new_tokens=max_new_tokens, stop=stop, sampling=sampling, seeds=seeds(ps)
        )
    for n in dict.fromkeys(block_sizes):
        methods[jacobi(n, model_tag)] = run(
            JacobiConfig(block_size=n, max_new_tokens=max_new_tokens, draft_init=draft_init)
        )
    for n in dict.fromkeys(lookup_sizes):
        methods[Method("lookup", block_size=n, model=model_tag)] = run(
            JFDecodeConfig(block_size=n, num_blocks=1, pool_size=0, lookup=n, max_new_tokens=max_new_tokens)
        )
    if variants_at is not None:
        n, new = variants_at, max_new_tokens
        variants = {
            "recycling": JFDecodeConfig(block_size=n, num_blocks=1, pool_size=4, seed_drafts=True, max_new_tokens=new),
            "multiblock": JFDecodeConfig(block_size=n, num_blocks=2, pool_size=0, max_new_tokens=new),
            "recycling_multiblock": JFDecodeConfig(block_size=n, seed_drafts=True, max_new_tokens=new),
        }
        for kind in variant_kinds:
            methods[Method(kind, model=model_tag)] = run(variants[kind])
    if tuned is not None:
        own = replace(tuned, max_new_tokens=max_new_tokens)
        methods[Method(tuned_kind, model=model_tag)] = run(own, ar_above_batch)
        if full_width and getattr(tuned, "adaptive_width", False):
            methods[Method(tuned_kind, model=model_tag, full_width=True)] = run(replace(own, adaptive_width=False))
    return methods
