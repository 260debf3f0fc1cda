"""The round's one training driver: from a model and its packed examples to the trained model directory.

One process (`training.strategy: single`) and every Ray Train worker (ddp, fsdp2: tasks/train_distributed.py) run
this same function; only where it runs differs (`rank`, `world`, `device`, and how the model is wrapped). Read top to
bottom: the model in fp32 masters, its examples, the wrapping for the strategy, the batches, the loop
(jf_core/training/trainer.py), and the directory written atomically in the model's dtype.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from jf_core.config import Profile
from jf_core.decoding.backends import grouped_attention
from jf_core.draft_adapter.adapter import directory_parts, for_training
from jf_core.model_dir import lineage, save_model_dir
from jf_core.models import ModelSpec, load_model
from jf_core.threads import ThreadGovernor
from jf_core.training.history import TpfProbe
from jf_core.training.jf_data import jf_batches, read_packed_share
from jf_core.training.losses import JacobiForcingObjective, check_lean_head, training_attention
from jf_core.training.noise import NoiseSchedule
from jf_core.training.parallel import Distributed, enable_activation_checkpointing, shard_fsdp2
from jf_core.training.precision import resolve_compute_dtype
from jf_core.training.trainer import Checkpoints, Every, Probe, TrainConfig, TrainSummary, train


def train_round(
    profile: Profile,
    model_in: str,
    packed: Path,
    checkpoints: Path,
    out: Path,
    *,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    threads: ThreadGovernor | None = None,
    progress: bool = False,
    log_every: int | None = None,
    on_log: Callable[[int, dict], None] | None = None,
) -> TrainSummary:
    """Train `model_in` on this process's share of `packed` (every world-th example from `rank`) and write `out`
    (rank 0; every rank takes part in gathering sharded weights). Checkpoints every `training.checkpoint_every`
    steps under `checkpoints` make a retried or restarted run resume where it died. Returns the run's summary (the
    training stage keeps it as `out`'s marker: jf_core/round/stages.py)."""
    t = profile.training
    distributed = t.strategy != "single"
    attention = training_attention(device, t.attention)
    dtype = ModelSpec(model_in, dtype=profile.model.dtype, device=device.type).resolved_dtype()
    # Sharded strategies load on the CPU: fully_shard moves each worker's shard to its device.
    model, tok = load_model(
        model_in, dtype="float32", device="cpu" if distributed else str(device), attn_implementation=attention
    )
    # fp32 master weights: the optimizer never steps bf16 weights; compute runs in training.compute_dtype (autocast;
    # `auto` measured here) and the trained model is written in the model's dtype.
    compute = resolve_compute_dtype(t.compute_dtype, dtype, device, model.config.hidden_size)
    compute_name = str(compute).removeprefix("torch.")
    adapter = for_training(model, t.draft_lora)  # None: the whole model trains
    examples = read_packed_share(packed, rank, world)
    if t.lean_loss:  # a property of the architecture: checked on the plain model, before wrapping or sharding
        first = next(
            jf_batches(examples, 1, tok.pad_token_id, seed=t.seed, variant=t.mask, span=t.draft_span, packing=t.packing)
        )
        check_lean_head(model, {k: v.to(model.device) for k, v in first.items()}, t.mask)

    parallel = Distributed(t.strategy) if distributed else None
    wrapped = _wrapped(model, t, compute, device)
    # Under `auto`, training's forwards and backwards read grouped KV heads in place on a CPU
    # (jf_core/decoding/grouped_attention.py): SmolLM2-135M trained 1.02-1.16x the packed tokens a second that
    # way, faster in each of six pairs (2026-12-06, docs/real-models.md), and in bf16 the attention's gradient by the
    # eager form with the LM head's cast kept, 1.17x more (docs/training.md); `sdpa` keeps transformers' own.
    with grouped_attention(model) if t.attention == "auto" else contextlib.nullcontext():
        result = train(
            wrapped,
            _batches(profile, examples, tok, rank, dense_mask=attention != "flex_attention"),
            JacobiForcingObjective.of(t, base=_frozen_base(model_in, device, attention) if t.base_kl_weight else None),
            TrainConfig.of(t, compute_dtype=compute_name, **({"log_every": log_every} if log_every else {})),
            hooks=_hooks(profile, examples, model, tok, checkpoints, distributed),
            progress=progress,
            on_log=on_log,
            parallel=parallel,
            threads=threads,
        )
    state = parallel.full_state_dict(wrapped) if parallel is not None else None  # every worker takes part
    summary = result.model_copy(update={"model_in": model_in, "strategy": t.strategy, "workers": world})
    if rank == 0:
        _save(model, tok, out, state=state, adapter=adapter is not None, dtype=dtype, model_in=model_in)
    return summary


def _wrapped(model: torch.nn.Module, t, compute: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The model as its strategy trains it: itself (one process), a DDP replica, or FSDP2 shards on the device."""
    if t.strategy == "fsdp2":
        return shard_fsdp2(model, compute, t.activation_checkpointing, t.cpu_offload)
    if t.activation_checkpointing:
        enable_activation_checkpointing(model)
    return _ddp(model, device) if t.strategy == "ddp" else model


def _batches(profile: Profile, examples, tok, rank: int, *, dense_mask: bool):
    """This worker's packed batches (its seed offset by its rank), with the embedded task's AR batches mixed in
    where the profile asks (one process only: the workers' shares replay as one process's global batches, which AR
    mixing would not)."""
    t = profile.training
    ar_mix = None
    if t.mix_ar_every and profile.prompts.source == "embedded" and t.strategy == "single":
        from jf_core.toy.data import ar_batches
        from jf_core.toy.task import make_split

        ar_mix = ar_batches(tok, make_split("train", 20_000), t.batch_size, t.seed)
    return jf_batches(
        examples,
        t.batch_size,
        tok.pad_token_id,
        seed=t.seed + rank,
        variant=t.mask,
        ar_batches=ar_mix,
        ar_every=t.mix_ar_every,
        dense_mask=dense_mask,
        redraw=NoiseSchedule.of(t) if t.state_pick == "each_visit" else None,
        copies=t.noisy_copies,
        span=t.draft_span,
        packing=t.packing,
        **_guessed(t, examples),
    )


def _guessed(t, examples) -> dict:
    """jf_batches' `guessed` and `guessed_weight` where training.guessed_weight < 1: the text proposers' guesses
    over these examples (the round's draft corpus among them where the round keeps one)."""
    if t.guessed_weight == 1:
        return {}
    from jf_core.training.guessed import TextGuesses

    return {"guessed": TextGuesses(examples, corpus=t.draft_corpus).depth, "guessed_weight": t.guessed_weight}


def _save(model, tok, out: Path, *, state, adapter: bool, dtype: torch.dtype, model_in: str) -> None:
    """The trained model directory, written atomically: the whole model in the model's dtype (from the gathered
    `state` when sharded), or what the draft adapter's module says a model with an adapter keeps."""
    parts = {"state_dict": state, "dtype": dtype, "extra_tensors": None}
    if adapter:
        parts = directory_parts(model)
    save_model_dir(
        _plain_model(model.config) if state is not None else model,
        out,
        tokenizer=tok,
        block={"lineage": lineage(model_in)},
        **parts,
    )


def _hooks(profile: Profile, examples, model, tok, checkpoints: Path, distributed: bool) -> list:
    """What the loop does every N steps, in this order: the TPF probe (one process only), the on-policy refresh,
    then the checkpoint (which keeps the probe's row)."""
    t = profile.training
    hooks: list = []
    if t.tpf_probe_every and not distributed:
        hooks.append(Probe(tpf_probe(profile, model, tok), Every(t.tpf_probe_every)))
    if t.onpolicy_every:  # draws new states into the pools; not after the last step, where nothing would use them
        hooks.append(Probe(on_policy(profile, examples, model, tok), Every(t.onpolicy_every, at_end=False)))
    return [*hooks, Checkpoints(checkpoints, Every(t.every()), keep=t.keep_checkpoints)]


def _ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A full replica per worker (gloo on CPU, NCCL on GPUs), gradients all-reduced in backward."""
    from torch.nn.parallel import DistributedDataParallel

    model = model.to(device)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _plain_model(config):
    """An unsharded, unwrapped model of this config without allocating weights: it only carries save_pretrained
    for the gathered state (saving through an FSDP2-sharded model would meet its DTensors)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _frozen_base(model_in: str, device: torch.device, attention: str) -> torch.nn.Module:
    """The input model, frozen, beside the one being trained: what `training.base_kl_weight` holds it to."""
    base, _ = load_model(model_in, dtype="float32", device=str(device), attn_implementation=attention)
    return base.requires_grad_(False)


def probe_prompts(profile: Profile, tokenizer) -> list[list[int]]:
    """The TPF probe's prompts (`training.tpf_probe_questions`): the first `tpf_probe_prompts` of the calibration
    split, or of the evaluation's held-out questions, rendered like the training prompts."""
    from jf_core.trajectory.prompts import calibration_prompts, held_out_source, load_prompts

    t, e = profile.training, profile.evaluation
    if t.tpf_probe_questions == "calibration":
        return calibration_prompts(profile.prompts, tokenizer, t.tpf_probe_prompts, e.calibration_split)
    # The probe's curve chooses recipes and step counts: the development half of the held-out questions.
    source = held_out_source(profile.prompts, e.source, e.split, "development")
    source = source.model_copy(update={"limit": t.tpf_probe_prompts})
    return [p.token_ids for p in load_prompts(source, tokenizer).items]


def tpf_probe(profile: Profile, model, tokenizer) -> Callable:
    """TPF of the model being trained: plain Jacobi at the round's block size and `tpf_probe_block_sizes` on
    `tpf_probe_prompts` calibration or held-out prompts (`tpf_probe_questions`), greedy, fp32 (training's masters; no
    autocast), in batches of the evaluation's batch size; TPF over all of them (tokens over forwards)."""
    from jf_core.decoding import JacobiConfig, jacobi_decode
    from jf_core.decoding.backends import decoding_attention
    from jf_core.decoding.stats import DecodeStats
    from jf_core.models import stop_tokens

    t, e = profile.training, profile.evaluation
    prompts = probe_prompts(profile, tokenizer)
    batches = [prompts[i : i + e.batch_size] for i in range(0, len(prompts), e.batch_size)]
    sizes = sorted({profile.trajectory.block_size, *t.tpf_probe_block_sizes})
    cfgs = [JacobiConfig(block_size=n, max_new_tokens=t.tpf_probe_tokens) for n in sizes]
    stop = stop_tokens(model, tokenizer)

    def tpf(m, cfg: JacobiConfig) -> float:
        stats = [jacobi_decode(m, batch, cfg, stop=stop).stats for batch in batches]
        return functools.reduce(DecodeStats.merge, stats).tpf

    def probe(m) -> dict[str, float]:
        with torch.no_grad(), decoding_attention(m):
            return {TpfProbe(cfg.block_size).key: tpf(m, cfg) for cfg in cfgs}

    return probe


def on_policy(profile: Profile, examples, model, tokenizer) -> Callable:
    """On-policy states: the model being trained decodes its own training prompts with the trajectories' draft
    settings, and what it visits joins the blocks' pools (jf_core/training/onpolicy.py)."""
    from jf_core.models import stop_tokens
    from jf_core.training.onpolicy import OnPolicyStates

    return OnPolicyStates(
        examples,
        prompts=profile.training.onpolicy_prompts,
        stop=stop_tokens(model, tokenizer),
        seed=profile.trajectory.seed,
        draft_init=profile.trajectory.draft_init,
        batch_size=profile.trajectory.batch_size,
    )
