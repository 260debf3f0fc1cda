"""`jf plan`: whether a profile fits on its GPUs, per stage, before any work starts.

The model is read from its config on the meta device (no weights are loaded or downloaded: a hub id whose config
is not cached here falls back to a snapshot shipped in jf_core/profiles/configs/). Per GPU:

- **Trajectory generation** (one actor per GPU): the weights in the model's dtype; the KV cache of a batch of
  `trajectory.batch_size` sequences of (longest prompt + max_new_tokens + one block) tokens, doubled for the
  rejected-draft slots the cache may hold before it compacts (jf_core/decoding/kv.py compacts above 50% waste), and
  a quarter more for the room it appends into (jf_core/decoding/reserved_cache.py `GROWTH`); a
  window's logits; one layer's activations; the fp32 LM head copy when `model.lm_head_fp32`.
- **Training**, for each strategy (`single`, `ddp`, `fsdp2` over `compute.train_workers`): fp32 master weights,
  fp32 gradients and AdamW's two fp32 moments (sharded over the workers by FSDP2); the compute-dtype copies
  (autocast's per-forward casts; FSDP2's unsharded root plus two layers in flight); DDP's gradient buckets;
  activations of a micro-batch of `batch_size x max_length` tokens with and without activation checkpointing
  (FlexAttention on GPUs: no L x L term); the loss's logits (memory-lean: one chunk; else the whole batch); the
  workspace (CUDA context, kernel workspaces, allocator slack). With a draft adapter (`training.draft_lora`)
  the base is frozen fp32 weights alone (no gradients, no AdamW state) and only the adapter trains, in one process.

Estimates, not measurements: parameters, gradients, optimizer state and the KV cache are exact byte counts (tests
check them against real allocations of small models); activations follow a per-token count of what a Llama-style
layer keeps for backward. A stage that does not fit names the first knob (or pair of knobs) that makes it fit.

Why one module of 400 lines: the stages' estimates share the model's byte counts and each other's terms (a
trajectory actor's KV cache is the evaluation's too), and `jf plan` prints them as one table; split by stage, each
part would import the others' internals.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jf_core.config import Profile
from jf_core.draft_adapter.config import DraftLora

GIB = 1024**3
WORKSPACE = int(1.5 * GIB)  # CUDA context, cuBLAS/attention workspaces, allocator slack
USABLE = 0.92  # of the card: the rest is fragmentation headroom
SNAPSHOTS = Path(__file__).parent / "profiles" / "configs"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(ValueError):
    """A profile that cannot fit: names the stage and the knob."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: int
    layer_params: int  # one decoder layer
    root_params: int  # everything outside the decoder layers (embeddings, final norm, LM head)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    # The projections a draft adapter adds to (jf_core/draft_adapter/): how many, and their summed
    # in + out features, so that a rank-r adapter holds r x `adapter_features` weights.
    adapter_projections: int = 0
    adapter_features: int = 0

    @classmethod
    def of(cls, config, name: str, adapter: DraftLora | None = None) -> ModelShape:
        """Count parameters on the meta device: the real model's modules, no memory; the adapter's projections as
        `adapter` (the profile's `training.draft_lora`) places them."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        from jf_core.draft_adapter.adapter import target_projections
        from jf_core.layers.blocks import decoder_layers

        layers = decoder_layers(model)
        total = sum(p.numel() for p in model.parameters())
        targets = [m for _, m in target_projections(model, adapter)]
        per_layer = sum(p.numel() for p in layers[0].parameters())
        text = config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        return cls(
            name=name,
            params=total,
            layer_params=per_layer,
            root_params=total - per_layer * len(layers),
            layers=len(layers),
            hidden=text.hidden_size,
            intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", heads) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            vocab=text.vocab_size,
            adapter_projections=len(targets),
            adapter_features=sum(m.in_features + m.out_features for m in targets),
        )


def model_config(profile: Profile):
    """(config, where it came from): a local directory, the embedded model's shape, the hub (cached), or a snapshot."""
    from transformers import AutoConfig

    from jf_core.model_import import PACKAGE_SCHEME, ModelImportError, find_package_gguf, package_model_dir

    path = profile.model.path
    if path == "embedded":
        from jf_core.toy.model import ToyModelConfig
        from jf_core.toy.tokenizer import build_tokenizer

        tok = build_tokenizer()
        return ToyModelConfig().to_hf(len(tok), tok.pad_token_id, tok.eos_token_id), "embedded model's shape"
    if path.startswith(PACKAGE_SCHEME):  # the GGUF an installed package holds: its config, no weights read
        package = path.removeprefix(PACKAGE_SCHEME)
        try:
            gguf, version = find_package_gguf(package)
        except ModelImportError as err:
            raise PlanError(f"model.path {path!r}: {err}") from None
        # Imported once already (any dtype): its config.json, without parsing the GGUF.
        pattern = package_model_dir(package, version, "*")
        for imported in sorted(pattern.parent.glob(f"{pattern.name}/config.json")):
            return AutoConfig.from_pretrained(imported.parent), f"{imported.parent} ({path} {version})"
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name), f"{gguf.name} ({path} {version})"
    local = Path(path).expanduser()
    if local.is_dir():
        return AutoConfig.from_pretrained(local), str(local)
    remote = profile.model.trust_remote_code
    try:  # the hub cache first: no network, and exactly what the run will load
        return AutoConfig.from_pretrained(path, trust_remote_code=remote, local_files_only=True), f"hub cache {path}"
    except (OSError, ValueError):
        pass
    snapshot = SNAPSHOTS / f"{path.replace('/', '--')}.json"
    if snapshot.is_file():  # a released checkpoint's config does not change: no need to wait on the network
        data = json.loads(snapshot.read_text())
        from transformers import CONFIG_MAPPING

        config = CONFIG_MAPPING[data.pop("model_type")](**{k: v for k, v in data.items() if k != "architectures"})
        return config, f"snapshot {snapshot.name}"
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=remote), f"hub {path}"
    except (OSError, ValueError):
        raise PlanError(
            f"model.path {path!r}: no config reachable (no local directory, no cached hub config, no snapshot in "
            f"{SNAPSHOTS}, hub unreachable); plan it from a local copy of its config.json"
        ) from None


@dataclass
class StagePlan:
    stage: str  # "trajectories" or "training (<strategy>)"
    lines: list[tuple[str, int]]  # (what, bytes)
    capacity: int  # bytes of the GPU
    knob: str | None = None  # what would make it fit, when it does not
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.lines)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity * USABLE


def _dtype(profile: Profile, on_gpu: bool = True) -> int:
    name = profile.model.dtype
    if name == "auto":
        name = "bfloat16" if on_gpu else "float32"
    return DTYPE_BYTES[name]


def trajectory_plan(shape: ModelShape, profile: Profile) -> StagePlan:
    from jf_core.decoding.reserved_cache import GROWTH  # torch and transformers: only when a plan is made

    d = _dtype(profile)
    t = profile.trajectory
    prompt = profile.prompts.max_prompt_tokens or 1024
    tokens = t.batch_size * (prompt + t.max_new_tokens + t.block_size)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * d
    lines = [
        ("weights", shape.params * d),
        (
            "KV cache (x2: rejected-draft slots before compaction; x1.25: room to append in place)",
            int(2 * (1 + GROWTH) * tokens * kv_per_token),
        ),
        ("window logits", t.batch_size * t.block_size * shape.vocab * d),
        ("one layer's activations", t.batch_size * t.block_size * (4 * shape.hidden + 3 * shape.intermediate) * d),
        ("workspace", WORKSPACE),
    ]
    if profile.model.lm_head_fp32:
        lines.append(("fp32 LM head copy", shape.vocab * shape.hidden * 4))
    notes = [] if profile.prompts.max_prompt_tokens else ["prompts.max_prompt_tokens unset: 1024 assumed"]
    return StagePlan("trajectories", lines, _capacity(profile), notes=notes)


def activation_bytes(shape: ModelShape, tokens: int, c: int, checkpointing: bool) -> int:
    """What the layers keep for backward for `tokens` tokens: per token and layer, a Llama-style layer keeps its
    norms' inputs and outputs, q/k/v before and after rotary, the attention output, the MLP's gate, up and their
    product (flash/flex attention: no L x L scores). With checkpointing only each layer's input is kept, plus one
    layer's full set while it is recomputed."""
    kv_dim = shape.kv_heads * shape.head_dim
    full_per_token = c * (8 * shape.hidden + 4 * kv_dim + 4 * shape.intermediate)
    if checkpointing:
        return tokens * (shape.layers * c * shape.hidden + full_per_token)
    return tokens * shape.layers * full_per_token


def training_plan(shape: ModelShape, profile: Profile, strategy: str, workers: int) -> StagePlan:
    t = profile.training
    c = _dtype(profile)
    p = shape.params
    shards = workers if strategy == "fsdp2" else 1
    tokens = t.batch_size * t.max_length
    part = f" (1/{shards})" if shards > 1 else ""
    rank = t.draft_lora.rank if t.draft_lora is not None else 0
    if rank:  # the base is frozen: no gradients or AdamW state for it; the adapter trains (one process: config.py)
        states = [
            ("fp32 base weights (frozen: no gradients, no AdamW state)", 4 * p),
            (f"draft adapter (rank {rank}): fp32 weights, grads, AdamW", 16 * rank * shape.adapter_features),
        ]
    else:
        states = [
            (f"fp32 master weights{part}", 4 * p // shards),
            (f"fp32 gradients{part}", 4 * p // shards),
            (f"AdamW moments, fp32{part}", 8 * p // shards),
        ]
    offloaded = strategy == "fsdp2" and t.cpu_offload
    lines = [] if offloaded else states
    if strategy == "fsdp2":
        lines.append(("unsharded root (embeddings, head) in compute dtype", c * shape.root_params))
        lines.append(("two layers in flight (all-gathered, and their fp32 reduce)", 2 * (c + 4) * shape.layer_params))
    else:
        lines.append(("compute-dtype weight casts (autocast)", c * p if c < 4 else 0))
    if strategy == "ddp":
        lines.append(("DDP gradient buckets", 4 * p))
    with_ac = t.activation_checkpointing
    lines.append(
        (
            f"activations, {tokens} tokens/micro-batch" + (" (checkpointed)" if with_ac else ""),
            activation_bytes(shape, tokens, c, with_ac),
        )
    )
    if rank:  # each projection's rank-r product x @ A^T, kept for backward
        lines.append((f"draft adapter's rank-{rank} activations", tokens * shape.adapter_projections * rank * c))
    if t.lean_loss:
        lines.append(
            ("loss: hidden states + one LM-head chunk", tokens * shape.hidden * c + 3 * t.loss_chunk * shape.vocab * 4)
        )
    else:
        lines.append(("loss: full fp32 logits, log-softmax, grad", 3 * tokens * shape.vocab * 4))
    lines.append(("workspace", WORKSPACE))
    label = (
        f"training ({strategy}"
        + (f" x {workers}" if strategy != "single" else "")
        + (", CPU offload)" if offloaded else ")")
    )
    checkpointed = _gib(activation_bytes(shape, tokens, c, True))
    # A draft adapter refuses checkpointing (a recomputed layer would run ungated): not an option to show.
    notes = [] if with_ac or rank else [f"with activation checkpointing: {checkpointed}"]
    if offloaded:
        notes.append(f"in host memory per worker: {_gib(sum(b for _, b in states))} (masters, gradients, AdamW)")
    return StagePlan(label, lines, _capacity(profile), notes=notes)


def _capacity(profile: Profile) -> int:
    return int(profile.compute.gpu_memory_gb * GIB)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _training_knobs(profile: Profile) -> list[tuple[str, Callable[[Profile], Profile]]]:
    """Changes that lower training memory, cheapest first (checkpointing costs ~30% compute; sharding needs GPUs)."""
    t, compute = profile.training, profile.compute

    def update(section: str, **values) -> Callable[[Profile], Profile]:
        return lambda p: p.model_copy(update={section: getattr(p, section).model_copy(update=values)})

    knobs: list[tuple[str, Callable[[Profile], Profile]]] = []
    if t.draft_lora is not None:  # one process, no checkpointing (config.py refuses both): only the batch is left
        return _batch_knobs(t, update)
    if not t.activation_checkpointing:
        knobs.append(("training.activation_checkpointing=true", update("training", activation_checkpointing=True)))
    if not t.lean_loss:
        knobs.append(("training.lean_loss=true", update("training", lean_loss=True)))
    workers = max(2, compute.train_workers)
    if t.strategy != "fsdp2":
        knobs.append(
            (
                f"training.strategy=fsdp2 compute.train_workers={workers}",
                lambda p: update("compute", train_workers=workers)(update("training", strategy="fsdp2")(p)),
            )
        )
    else:
        more = 2 * compute.train_workers
        knobs.append((f"compute.train_workers={more}", update("compute", train_workers=more)))
        if not t.cpu_offload:
            knobs.append(("training.cpu_offload=true", update("training", cpu_offload=True)))
    return knobs + _batch_knobs(t, update)


def _batch_knobs(t, update) -> list[tuple[str, Callable[[Profile], Profile]]]:
    """The last resorts: a smaller micro-batch (the same global batch), then shorter packed sequences."""
    knobs = []
    if t.batch_size > 1:
        half = t.batch_size // 2
        knobs.append(
            (
                f"training.batch_size={half} training.grad_accum={t.grad_accum * 2} (same global batch)",
                update("training", batch_size=half, grad_accum=t.grad_accum * 2),
            )
        )
    knobs.append((f"training.max_length={t.max_length // 2}", update("training", max_length=t.max_length // 2)))
    return knobs


def _trajectory_knobs(profile: Profile) -> list[tuple[str, Callable[[Profile], Profile]]]:
    t = profile.trajectory
    knobs = []
    for size in (t.batch_size // 2, t.batch_size // 4, 1):
        if 1 <= size < t.batch_size:
            knobs.append(
                (
                    f"trajectory.batch_size={size}",
                    lambda p, size=size: p.model_copy(
                        update={"trajectory": p.trajectory.model_copy(update={"batch_size": size})}
                    ),
                )
            )
    return knobs


def _fix(plan_fn: Callable[[Profile], StagePlan], profile: Profile, knobs) -> str | None:
    for name, change in knobs:
        if plan_fn(change(profile)).fits:
            return name
    for (a, first), (b, second) in ((x, y) for i, x in enumerate(knobs) for y in knobs[i + 1 :]):
        if plan_fn(second(first(profile))).fits:
            return f"{a} and {b}"
    return None


def plan(profile: Profile) -> tuple[ModelShape, str, list[StagePlan]]:
    """The profile's stages planned: trajectories, then training under each strategy (the profile's own first)."""
    config, source = model_config(profile)
    shape = ModelShape.of(config, profile.model.path, profile.training.draft_lora)
    workers = max(profile.compute.train_workers, 1)
    stages = [trajectory_plan(shape, profile)]
    strategies = [profile.training.strategy] + [s for s in ("single", "ddp", "fsdp2") if s != profile.training.strategy]
    if profile.training.draft_lora is not None:  # a draft adapter trains in one process (config.py refuses the others)
        strategies = ["single"]
    for i, strategy in enumerate(strategies):
        n = workers if strategy != "single" else 1
        if i > 0 and strategy == "fsdp2" and n == 1:  # the alternative worth showing is a full node
            n = 8
        stages.append(training_plan(shape, profile, strategy, n))
    traj = stages[0]
    if not traj.fits:
        traj.knob = _fix(lambda p: trajectory_plan(shape, p), profile, _trajectory_knobs(profile))
    own = stages[1]
    if not own.fits:
        own.knob = _fix(
            lambda p: training_plan(shape, p, p.training.strategy, max(p.compute.train_workers, 1)),
            profile,
            _training_knobs(profile),
        )
    return shape, source, stages


def on_gpu(profile: Profile) -> bool:
    return profile.compute.gpus_per_worker > 0 or profile.model.device.startswith("cuda")


def check(profile: Profile) -> list[StagePlan]:
    """Refuse, before any work, a GPU profile whose trajectory or training stage cannot fit (PlanError naming the
    stage and the knob); CPU profiles have nothing to plan. Training settings the trainer would refuse are refused
    here too: a round would otherwise spend its trajectories' hours first (`--set training.steps=6` under the
    profile's warmup of 10)."""
    t = profile.training
    if t.warmup_steps >= t.steps:
        raise PlanError(
            f"profile {profile.name!r}: training.warmup_steps ({t.warmup_steps}) must be below training.steps "
            f"({t.steps}); set both"
        )
    if not on_gpu(profile):
        return []
    _, _, stages = plan(profile)
    for stage in stages[:2]:
        if not stage.fits:
            fix = f"; try {stage.knob}" if stage.knob else "; no single knob or pair of knobs fits it"
            raise PlanError(
                f"profile {profile.name!r}: {stage.stage} needs {_gib(stage.total)} per GPU, the GPU has "
                f"{_gib(stage.capacity)} ({_gib(int(stage.capacity * USABLE))} usable){fix} (`jf plan` shows the parts)"
            )
    return stages[:2]


def count(n: int) -> str:
    """A parameter count as people write it: 1.54B, 135.0M, 812.3K (the embedded model was "0.00B")."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'B' else 1}f}{unit}"
    return str(n)


def format_plan(profile: Profile, shape: ModelShape, source: str, stages: list[StagePlan]) -> str:
    lines = [
        f"# Memory plan: {profile.name} ({shape.name}, {count(shape.params)} parameters, {shape.layers} layers; "
        f"config from {source})",
        f"per GPU: {profile.compute.gpu_memory_gb:g} GB card, {USABLE:.0%} usable",
        "",
    ]
    for i, stage in enumerate(stages):
        mark = " (this profile)" if i < 2 else ""
        verdict = "fits" if stage.fits else "DOES NOT FIT" + (f": try {stage.knob}" if stage.knob else "")
        lines.append(f"## {stage.stage}{mark}: {_gib(stage.total)} -> {verdict}")
        lines += [f"  {what:<58} {_gib(n):>10}" for what, n in stage.lines]
        lines += [f"  note: {n}" for n in stage.notes]
        lines.append("")
    return "\n".join(lines)
