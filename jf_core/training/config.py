"""The profile's `training` section: what a round's training does, as data, checked field against field.

Each implementation is built from it next to itself: `NoiseSchedule.of` (noise.py), `JacobiForcingObjective.of`
(losses.py) and `TrainConfig.of` (trainer.py), shared by the local and the distributed trainer. `jf_core.config`
composes it into the profile, as it does the prompt source (`trajectory/prompts.py`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jf_core.draft_adapter.config import DraftLora

# The schedules a window of target ratios defines (training.schedule); noise.py implements them.
WindowSchedule = Literal["progressive", "progressive_phase", "reverse", "random"]


class JFTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # single: this process; ddp: a full replica per Ray Train worker; fsdp2: parameters, gradients and optimizer
    # state sharded over the workers (compute.train_workers). Weights are fp32 masters always; compute runs in
    # `compute_dtype`. See tasks/train_distributed.py and `jf plan`.
    strategy: Literal["single", "ddp", "fsdp2"] = "single"
    # What training's matmuls run in (autocast, or FSDP2's MixedPrecisionPolicy); model: the model's dtype
    # (model.dtype). bfloat16 under an fp32 model trains faster where bf16 matmuls are (a GPU; some CPUs) while the
    # optimizer still steps fp32 weights and the model directory keeps the model's dtype, so the decoders stay fp32
    # and exact. auto: the faster of the two, measured on the machine that trains (jf_core/training/precision.py:
    # CPUs with the same AVX512-BF16 flag differ). A draft adapter keeps the base's greedy text whatever its
    # training's numerics (the base verifies).
    compute_dtype: Literal["model", "float32", "bfloat16", "auto"] = "model"
    activation_checkpointing: bool = False  # recompute each layer's activations in backward (non-reentrant)
    cpu_offload: bool = False  # fsdp2: fp32 masters, gradients and AdamW state in host memory (one small GPU)
    checkpoint_every: int | None = Field(None, ge=1)  # steps between resumable checkpoints; None: a tenth of the run
    # The newest checkpoints kept while a run trains (older ones go as each new one is complete; the round deletes
    # the rest once its model is saved): a 3e6-token run at checkpoint_every 100 writes 54, each of them a whole
    # model's size where the whole model trains.
    keep_checkpoints: int = Field(2, ge=1)
    lean_loss: bool = True  # the LM head on loss positions only, in chunks (losses.py); False: full logits
    loss_chunk: int = Field(1024, ge=1)  # LM-head rows per chunk
    # A draft adapter's training: the positions that do not depend on the adapter (prompt, clean copies) run once
    # without autograd as a KV cache, the drafted ones with autograd over it (context_cache.py); False: one packed
    # forward through every position. The same losses and gradients either way.
    context_cache: bool = True
    # ...and with training.packing spans, each example's context (its prompt and clean answer, the same on every
    # visit) kept from one visit to the next, up to this many MB: the first that fit are kept, the others computed
    # on each visit (context_store.py); 0: computed on every visit. A whole model (no draft_lora) computes it every
    # visit.
    context_memory_mb: int = Field(0, ge=0)
    # The attention kernel training runs: auto is FlexAttention's block masks on CUDA (no dense L x L mask; one
    # packed forward) and SDPA with the dense mask elsewhere (where context_cache's two passes and the kept
    # contexts apply), on a CPU reading grouped KV heads in place, in bf16 by the eager form where a gradient is
    # wanted (jf_core/decoding/grouped_attention.py: 1.07-1.75x the kernel at a draft adapter's shapes). sdpa is
    # transformers' SDPA as it comes; on CUDA the dense-mask path: the way back when FlexAttention's compile fails on
    # a GPU (bench/gpu_check.py's flex_training section says whether it does).
    attention: Literal["auto", "sdpa", "flex_attention"] = "auto"
    # The round's greedy answers (its trajectories' fixed points, not reference text) kept beside the trained model
    # as its draft corpus (draft_corpus.npy), which suffix drafts copy from when the decode config turns them on
    # (jf_core/decoding/proposers/suffix.py); the tune tries them where its grid names `suffix`.
    draft_corpus: bool = True
    steps: int = Field(600, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(30, ge=0)
    batch_size: int = Field(16, ge=1)  # per worker: the global batch is batch_size x grad_accum x workers
    grad_accum: int = Field(1, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    ar_weight: float = Field(1.0, ge=0)  # lambda
    consistency_weight: float = Field(1.0, ge=0)
    temperature: float = Field(1.0, gt=0)  # tau
    # What pulls a noisy copy's predictions to its clean copy's (losses.py): kl, KL(clean || noisy) on the
    # distributions (upstream's soft cross entropy, 0 when they agree); tv, their total variation (bounded, and
    # blind to how the teacher ranks the tokens a draft will never pick: SGLang's UNO found it better for a draft
    # adapter); fixed_point, cross entropy to the fixed point's tokens (hard targets: the base's greedy tokens
    # where the data is its greedy text). With a draft adapter the clean copy is the frozen base's, so kl and tv
    # measure the distance to the base's own distribution at no extra forward.
    consistency: Literal["kl", "tv", "fixed_point"] = "kl"
    # Keeping the model's own text: weight of KL(base || model) on the next-token distributions at every answer
    # position the AR loss scores, against a frozen copy of the input model (one more forward a step, no backward).
    # 0: no base copy is loaded. The AR loss holds only the argmax on the trained text; this holds the whole
    # distribution, near-ties included (losses.py).
    base_kl_weight: float = Field(0.0, ge=0)
    # jacobi_forcing: noisy blocks picked by the noise schedule, conditioned on noisy context (the mask); cllm: the
    # CLLM baseline (Kou et al. 2024): a uniformly drawn intermediate Jacobi state of each block, conditioned on the
    # fixed point before it (mask clean_context), pulled to the fixed point's predictions, no noise schedule. Under
    # the clean_context mask each noisy block sees exactly CLLM's input [prompt][fixed point < j][state of block j]
    # and its clean copy gives CLLM's teacher, so one packed forward computes CLLM's per-block loss.
    method: Literal["jacobi_forcing", "cllm"] = "jacobi_forcing"
    # jacobi_forcing only, as are the next 3 (noise.py says what each schedule does)
    schedule: WindowSchedule = "progressive"
    window: int = Field(16, ge=1)  # w: blocks per noise window
    min_ratio: float = Field(0.0, ge=0, le=1)
    max_ratio: float = Field(1.0, ge=0, le=1)
    # With a draft adapter either mask fits a decoder: clean_context is plain Jacobi's (the drafted block sees the
    # base's committed cache), shipped is multi-block's (the next block is drafted on the chain of a block still in
    # flight, which the adapter computed: in training the earlier noisy blocks, gated the same way).
    mask: Literal["shipped", "clean_context"] = "shipped"
    # Which draft state a block's noisy copy is: at_packing, the one state the schedule picked when packing (every
    # visit sees the same); each_visit, drawn again from all the block's recorded states each time its example is
    # seen (the schedule seeded by the visit: jf_core/training/packing.py `redrawn`).
    state_pick: Literal["at_packing", "each_visit"] = "at_packing"
    # Noisy copies of every block a visit (each_visit only): K > 1 packs K - 1 more, drawn from the block's states,
    # after the clean blocks; one prompt and clean context serves them all (jf_core/training/packing.py), which a
    # draft adapter's step computes once, without autograd.
    noisy_copies: int = Field(1, ge=1)
    # The drafted span: K > 0 takes the consistency loss (and a draft adapter's gate) on each noisy block's first K
    # positions from its first departure from the fixed point only, the slots a decoder's K-slot draft chain reads
    # (JacobiConfig.draft_span); 0, the whole rest of the block. A draft adapter's step then computes only those
    # positions with autograd (context_cache.py drops the ones no loss reads).
    draft_span: int = Field(0, ge=0)
    # The consistency loss's weight at a student the text proposers already guess (jf_core/training/guessed.py):
    # prompt lookup, and suffix drafts from the other half of the round's answers, hold its target within their
    # guess from the same root, so at decode time their branch wins whatever the adapter drafts there; 1: every
    # student alike; 0: such students are left out (and a span with no other student is not packed).
    guessed_weight: float = Field(1.0, ge=0, le=1)
    # How a packed example lays out its noisy blocks (jf_core/training/spans.py): blocks, the paper's
    # [prompt][N_0][C_0][N_1][C_1]..., every noisy block whole beside its clean copy; spans, the prompt and the clean
    # answer as one causal text, then each noisy block from its first departure to its last student only, seeing the
    # clean text before it. Under the clean-context mask the two are the same losses of the same weights; spans packs
    # a third fewer tokens (the noisy blocks' correct prefixes and unread tails are not packed again), and its
    # context, the same on every visit, is what context_memory_mb keeps.
    packing: Literal["blocks", "spans"] = "blocks"
    # On-policy states: every this many steps the model being trained decodes `onpolicy_prompts` of its training
    # prompts (in turn) and the draft states it visits join those blocks' pools (jf_core/training/onpolicy.py).
    onpolicy_every: int | None = Field(None, ge=1)
    onpolicy_prompts: int = Field(8, ge=1)
    # Draft-only LoRA (jf_core/draft_adapter/): freezes the model and trains an adapter that acts only where the
    # decoder drafts; the base verifies, so the output stays the base's greedy text. None: the whole model trains
    # (it drafts and verifies).
    draft_lora: DraftLora | None = None
    max_length: int = Field(2048, ge=8)
    mix_ar_every: int = Field(0, ge=0)  # every k-th batch is plain AR on ground-truth data (embedded task only)
    seed: int = 0
    # TPF against training steps: every this many steps (None: never), plain Jacobi at the round's block size (and
    # at each of `tpf_probe_block_sizes`, e.g. [16, 32]) on `tpf_probe_prompts` calibration prompts,
    # `tpf_probe_tokens` new tokens each (one-process training only). It reads the model and changes nothing in it:
    # rounds with and without it train the same weights.
    tpf_probe_every: int | None = Field(None, ge=1)
    # calibration: the prompt source's calibration split; held_out: the development half of the evaluation's
    # held-out questions (its own file where evaluation.source names another, e.g. GSM8K's test split; else the
    # held-out hash split), for a learning curve on questions of the kind the round is judged on. Recipes and step
    # counts are chosen by that curve, so it never reads the confirmation half the round's figures come from.
    tpf_probe_questions: Literal["calibration", "held_out"] = "calibration"
    tpf_probe_prompts: int = Field(4, ge=1)
    tpf_probe_tokens: int = Field(64, ge=1)
    tpf_probe_block_sizes: list[Annotated[int, Field(ge=1)]] = []

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        """A profile or override written with a field's old spelling is refused with the new one, not only as an
        unknown key."""
        if isinstance(data, dict) and "hard_targets" in data:
            new = "fixed_point" if data["hard_targets"] else "kl"
            raise ValueError(f"training.hard_targets is one choice of training.consistency now: consistency: {new}")
        if isinstance(data, dict) and {"draft_lora_rank", "draft_lora_alpha"} & set(data):
            rank, alpha = data.get("draft_lora_rank"), data.get("draft_lora_alpha")
            new = "null (the whole model trains)" if not rank else f"{{rank: {rank}, alpha: {alpha or rank}}}"
            raise ValueError(
                f"training.draft_lora_rank / draft_lora_alpha are one section now: training.draft_lora: {new}"
            )
        return data

    @model_validator(mode="after")
    def _probe_in_one_process(self) -> JFTrainConfig:
        if self.tpf_probe_every is not None and self.strategy != "single":
            raise ValueError(
                f"training.tpf_probe_every decodes with the whole model in one process: strategy {self.strategy} "
                "shards it over workers (set strategy single, or tpf_probe_every null)"
            )
        return self

    @model_validator(mode="after")
    def _copies_drawn(self) -> JFTrainConfig:
        if self.noisy_copies > 1 and self.state_pick != "each_visit":
            raise ValueError(
                "training.noisy_copies > 1 draws each visit's copies from every block's states, which only each_visit "
                "does: set training.state_pick: each_visit"
            )
        return self

    @model_validator(mode="after")
    def _onpolicy(self) -> JFTrainConfig:
        if self.onpolicy_every is None:
            return self
        if self.state_pick != "each_visit":
            raise ValueError(
                "training.onpolicy_every adds states to each block's pool, which only each_visit draws from: set "
                "training.state_pick: each_visit"
            )
        if self.strategy != "single":
            raise ValueError(
                f"training.onpolicy_every decodes with the whole model in one process: strategy {self.strategy} "
                "shards it over workers (set strategy single, or onpolicy_every null)"
            )
        return self

    @model_validator(mode="after")
    def _base_kl_in_one_process(self) -> JFTrainConfig:
        if self.base_kl_weight and self.strategy != "single":
            raise ValueError(
                f"training.base_kl_weight keeps a whole frozen copy of the input model in one process: strategy "
                f"{self.strategy} shards the model over workers (set strategy single, or base_kl_weight 0)"
            )
        return self

    @model_validator(mode="after")
    def _spans_mask(self) -> JFTrainConfig:
        if self.packing == "spans" and self.mask != "clean_context":
            raise ValueError(
                f"training.packing spans lets a noisy block see the clean text before it, which is training.mask "
                f"clean_context's context, not {self.mask}'s (its noisy blocks see the earlier noisy ones): set "
                "training.mask clean_context, or packing blocks"
            )
        return self

    @model_validator(mode="after")
    def _guessed(self) -> JFTrainConfig:
        if self.guessed_weight < 1:
            needs = {
                "packing": (self.packing == "spans", "spans (each span's root is where the text's guess starts)"),
                "strategy": (self.strategy == "single", "single (the guesses are made over all the examples)"),
            }
            for name, (holds, want) in needs.items():
                if not holds:
                    raise ValueError(f"training.guessed_weight < 1 weighs the spans' students: training.{name} {want}")
        return self

    @model_validator(mode="after")
    def _context_memory(self) -> JFTrainConfig:
        # Like context_cache, it acts on a draft adapter's two passes only: a whole model's context changes as it
        # trains, so there it computes every visit's context (planning a whole-model copy of a profile stays valid).
        needs = {
            "packing": (self.packing == "spans", "spans (the blocks layout's context changes with every draw)"),
            "context_cache": (self.context_cache, "true (the context's own pass is what is kept)"),
        }
        for name, (holds, want) in needs.items():
            if self.context_memory_mb and not holds:
                raise ValueError(f"training.context_memory_mb keeps a context between visits: training.{name} {want}")
        return self

    @model_validator(mode="after")
    def _cllm_mask(self) -> JFTrainConfig:
        if self.method == "cllm" and self.mask != "clean_context":
            raise ValueError(
                "training.method cllm conditions each draft on the fixed point before it: set training.mask "
                "clean_context (the shipped mask's noisy context is what Jacobi Forcing adds)"
            )
        return self

    @model_validator(mode="after")
    def _draft_lora(self) -> JFTrainConfig:
        if self.draft_lora is None:
            return self
        refused = {
            "strategy": (self.strategy != "single", "the adapter trains in one process (strategy single)"),
            "activation_checkpointing": (
                self.activation_checkpointing,
                "recomputing a layer in backward would run it without the adapter's gate",
            ),
            "base_kl_weight": (self.base_kl_weight > 0, "the base is frozen and verifies: there is no text to keep"),
        }
        for name, (bad, why) in refused.items():
            if bad:
                raise ValueError(f"training.draft_lora with training.{name} = {getattr(self, name)!r}: {why}")
        return self

    @property
    def method_name(self) -> str:
        """The method as run names and evaluation labels say it."""
        return "CLLM" if self.method == "cllm" else "Jacobi Forcing"

    @property
    def noisy_width(self) -> int | None:
        """The most positions a noisy copy of a block packs, for packing's fit: a span's `draft_span` in the spans
        layout; None, a whole block (the blocks layout, or spans to the block's end)."""
        return self.draft_span if self.packing == "spans" and self.draft_span else None

    @property
    def noise_kind(self) -> str:
        """What picks each block's noisy state: the noise schedule, or CLLM's uniformly drawn Jacobi state."""
        return "uniform_state" if self.method == "cllm" else self.schedule

    def every(self) -> int:
        """Steps between resumable checkpoints."""
        return self.checkpoint_every or max(1, self.steps // 10)
