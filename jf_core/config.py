"""One typed config schema for the CLI, the flows' parameters and prefect.yaml.

A profile (YAML under jf_core/profiles/, or any path) names a model, a prompt source and the knobs of each stage.
`tiny` is the embedded default (CPU, minutes); real profiles (a 7B coder model on GPUs) use the same code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, field_validator, model_validator

from jf_core.training.noise import WindowSchedule
from jf_core.trajectory.prompts import PromptSourceConfig

PROFILES_DIR = Path(__file__).parent / "profiles"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    path: str = "embedded"  # local directory, hub id, or "embedded" (bootstrapped on first use)
    # fp32: greedy Jacobi decoding is token-for-token greedy AR. bf16/fp16: every committed token is the argmax of
    # the forward that verified it, but a wide window and a one-token step run different kernels and near-tied
    # argmaxes can flip (measured and reported as the identical fraction): docs/decoding.md, "numerics".
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False  # code shipped with a checkpoint runs only when this is on
    lm_head_fp32: bool = False  # decoding a bf16/fp16 model: fp32 logits, fewer argmax flips (models.upcast_lm_head)

    def decode_kwargs(self) -> dict:
        """load_model's placement and numerics for decoding this model (trajectories, evaluation, serving)."""
        return {
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
            "lm_head_fp32": self.lm_head_fp32,
        }

    def resolve(self, train_threads: int | None = None, on_log: Callable[[int, dict], None] | None = None) -> str:
        """The model's location, bootstrapping the embedded default when asked for it (training on `train_threads`,
        the profile's compute.threads: the count is part of what the embedded model is; `on_log` gets its logged
        rows instead of a terminal bar), and importing the GGUF an installed package holds (`package:<name>`, once,
        under $JF_HOME/models) when that is asked for."""
        if self.path == "embedded":
            from jf_core.toy.bootstrap import BootstrapConfig, ensure_embedded_model

            cfg = BootstrapConfig(threads=train_threads)
            return str(ensure_embedded_model(cfg, progress=on_log is None, on_log=on_log))
        from jf_core.model_import import PACKAGE_SCHEME, ensure_package_model

        if self.path.startswith(PACKAGE_SCHEME):
            # fp32 whatever the profile computes in: a bf16 profile casts at load, from exact dequantized values
            return str(ensure_package_model(self.path))
        return self.path


class TrajectoryConfig(_Strict):
    block_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    seed: int = 0
    batch_size: int = Field(16, ge=1)
    shard_size: int = Field(64, ge=1)  # prompts per shard: the unit of work, retry and resume
    draft_init: Literal["prompt_sample", "repeat_last", "random_vocab"] = "prompt_sample"
    round_id: str = "round-0"
    # jacobi: every block's states recorded by Jacobi decoding; synthetic: the fixed points from greedy AR (batched,
    # far cheaper) and each block's states made by corrupting its tail with `corruption` noise, as upstream's
    # masking-based first round does (jf_core/trajectory/synthetic.py). Same records, `kind` on each row.
    kind: Literal["jacobi", "synthetic"] = "jacobi"
    corruption: Literal["context", "vocab"] = "context"

    def collect_config(self):
        from jf_core.trajectory.collect import CollectConfig

        return CollectConfig(**self.model_dump(exclude={"shard_size"}))


class ComputeConfig(_Strict):
    workers: int = Field(2, ge=1)  # trajectory actors: one per GPU on GPU hosts, one per CPU slot here
    gpus_per_worker: float = Field(0, ge=0)  # per trajectory actor and per training worker
    cpus_per_worker: float = Field(1, gt=0)
    train_workers: int = Field(1, ge=1)  # Ray Train workers for training.strategy ddp / fsdp2
    train_max_failures: int = Field(2, ge=0)  # worker-group restarts (each resumes from the last checkpoint)
    gpu_memory_gb: float = Field(80.0, gt=0)  # per GPU, for `jf plan` and the flow's check before any work
    ray_address: str | None = None  # None: RAY_ADDRESS if set, else a private loopback Ray (infra/ray_cluster.py)
    max_restarts: int = Field(2, ge=0)
    max_task_retries: int = Field(2, ge=0)
    # torch's CPU threads for training and evaluation in the flow's process. None: every CPU this process may use
    # for training, the CPUs other processes leave free for evaluation (jf_core/threads.py).
    threads: int | None = Field(None, ge=1)
    # Training on CPU: false keeps one thread count for the whole run, so the same command gives the same model
    # whatever else the machine runs (threads split a gradient's sums, and the order changes its last bits: 1 and 2
    # threads trained different models). True follows the CPUs other processes leave free: faster beside other
    # work, but the model then depends on the load. Decoding gives the same tokens on any count.
    adaptive_threads: bool = False
    # GPU stages hold this many slots of a Prefect global concurrency limit of this name, one per GPU they occupy
    # (tasks/gpu_slots.py); null: no limit. Leases are renewed while a stage runs; a dead worker's lapse after this.
    gpu_limit: str | None = "gpu"
    gpu_lease_seconds: float = Field(300, ge=60, le=86_400)  # Prefect's bounds


class JFTrainConfig(_Strict):
    # single: this process; ddp: a full replica per Ray Train worker; fsdp2: parameters, gradients and optimizer
    # state sharded over the workers (compute.train_workers). Weights are fp32 masters always; compute runs in the
    # model's dtype (model.dtype). See tasks/train_distributed.py and `jf plan`.
    strategy: Literal["single", "ddp", "fsdp2"] = "single"
    activation_checkpointing: bool = False  # recompute each layer's activations in backward (non-reentrant)
    cpu_offload: bool = False  # fsdp2: fp32 masters, gradients and AdamW state in host memory (one small GPU)
    checkpoint_every: int | None = Field(None, ge=1)  # steps between resumable checkpoints; None: a tenth of the run
    lean_loss: bool = True  # the LM head on loss positions only, in chunks (losses.py); False: full logits
    loss_chunk: int = Field(1024, ge=1)  # LM-head rows per chunk
    steps: int = Field(600, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(30, ge=0)
    batch_size: int = Field(16, ge=1)  # per worker: the global batch is batch_size x grad_accum x workers
    grad_accum: int = Field(1, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    ar_weight: float = Field(1.0, ge=0)  # lambda
    consistency_weight: float = Field(1.0, ge=0)
    temperature: float = Field(1.0, gt=0)  # tau
    hard_targets: bool = False
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
    mask: Literal["shipped", "clean_context"] = "shipped"
    # Which draft state a block's noisy copy is: at_packing, the one state the schedule picked when packing (every
    # visit sees the same); each_visit, drawn again from all the block's recorded states each time its example is
    # seen (the schedule seeded by the visit: jf_core/training/packing.py `redrawn`).
    state_pick: Literal["at_packing", "each_visit"] = "at_packing"
    # On-policy states: every this many steps the model being trained decodes `onpolicy_prompts` of its training
    # prompts (in turn) and the draft states it visits join those blocks' pools (jf_core/training/onpolicy.py).
    onpolicy_every: int | None = Field(None, ge=1)
    onpolicy_prompts: int = Field(8, ge=1)
    max_length: int = Field(2048, ge=8)
    mix_ar_every: int = Field(0, ge=0)  # every k-th batch is plain AR on ground-truth data (embedded task only)
    seed: int = 0
    # TPF against training steps: every this many steps (None: never), plain Jacobi at the round's block size (and
    # at each of `tpf_probe_block_sizes`, e.g. [16, 32]) on `tpf_probe_prompts` calibration prompts,
    # `tpf_probe_tokens` new tokens each (one-process training only). It reads the model and changes nothing in it:
    # rounds with and without it train the same weights.
    tpf_probe_every: int | None = Field(None, ge=1)
    tpf_probe_prompts: int = Field(4, ge=1)
    tpf_probe_tokens: int = Field(64, ge=1)
    tpf_probe_block_sizes: list[Annotated[int, Field(ge=1)]] = []

    # The one mapping from this config to the training objects, shared by the local and the distributed trainer.
    @model_validator(mode="after")
    def _probe_in_one_process(self) -> JFTrainConfig:
        if self.tpf_probe_every is not None and self.strategy != "single":
            raise ValueError(
                f"training.tpf_probe_every decodes with the whole model in one process: strategy {self.strategy} "
                "shards it over workers (set strategy single, or tpf_probe_every null)"
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
    def _cllm_mask(self) -> JFTrainConfig:
        if self.method == "cllm" and self.mask != "clean_context":
            raise ValueError(
                "training.method cllm conditions each draft on the fixed point before it: set training.mask "
                "clean_context (the shipped mask's noisy context is what Jacobi Forcing adds)"
            )
        return self

    @property
    def method_name(self) -> str:
        """The method as run names and evaluation labels say it."""
        return "CLLM" if self.method == "cllm" else "Jacobi Forcing"

    @property
    def noise_kind(self) -> str:
        """What picks each block's noisy state: the noise schedule, or CLLM's uniformly drawn Jacobi state."""
        return "uniform_state" if self.method == "cllm" else self.schedule

    def noise_schedule(self):
        from jf_core.training.noise import NoiseSchedule

        return NoiseSchedule(
            self.noise_kind, window=self.window, min_ratio=self.min_ratio, max_ratio=self.max_ratio, seed=self.seed
        )

    def objective(self, base=None):
        """The loss; `base`: the frozen input model that `base_kl_weight` compares against (needed when it is > 0)."""
        from jf_core.training.losses import JacobiForcingObjective, JFLossConfig

        loss = JFLossConfig(
            ar_weight=self.ar_weight,
            consistency_weight=self.consistency_weight,
            temperature=self.temperature,
            hard_targets=self.hard_targets,
            chunk=self.loss_chunk,
            base_kl_weight=self.base_kl_weight,
        )
        return JacobiForcingObjective(loss, self.mask, lean=self.lean_loss, base=base)

    def every(self) -> int:
        return self.checkpoint_every or max(1, self.steps // 10)

    def loop(self, log_every: int = 10, compute_dtype: str = "float32"):
        """The loop's settings; `compute_dtype` is the model's (a profile's model.dtype, "auto" meaning fp32 on CPU
        and bf16 on CUDA)."""
        import torch

        from jf_core.training.trainer import TrainConfig

        return TrainConfig(
            compute_dtype=getattr(torch, compute_dtype),
            steps=self.steps,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            grad_accum=self.grad_accum,
            grad_clip=self.grad_clip,
            seed=self.seed,
            log_every=log_every,
        )


class TuneConfig(_Strict):
    """Autotuning of the round's decode config (n, K, pool_size, r) for TPS on this hardware."""

    enabled: bool = False
    prompts: int = Field(12, ge=1)  # calibration prompts
    block_sizes: list[int] = [16, 32, 64]
    num_blocks: list[int] = [1, 2, 3]
    pool_sizes: list[int] = [0, 2, 4]
    spawn_ratios: list[float] = [0.5, 0.85]
    ngrams: list[int] = [0]  # recycled candidate length; 0 = n - 1
    seed_drafts: list[bool] = [False, True]  # fresh drafts from recycled n-grams
    # Adaptive width (jf_core/decoding/width.py): slots per expected accepted token, 0 = full-width windows; and the
    # slots beyond that. Narrow windows lose some TPF and gain more in cost per forward wherever width costs compute.
    width_scales: list[float] = [0.0, 2.0]
    width_margins: list[int] = [2]

    @field_validator("width_scales", "width_margins")
    @classmethod
    def _non_negative(cls, values: list, info):
        if not values or any(v < 0 for v in values):
            raise ValueError(f"{info.field_name} must be a non-empty list of numbers >= 0, got {values}")
        return values

    repeats: int = Field(2, ge=1)  # runs per candidate, fastest kept: single runs let machine noise pick the winner
    # AR against the winner at these batch sizes: the crossover above which a server should run AR (stored in the
    # model's jacobi_forcing block); empty to skip.
    crossover_batch_sizes: list[int] = [1, 2, 4, 8, 16, 32]


class EvalConfig(_Strict):
    """The evaluation of a model (jf_core/evaluation/evaluate.py); prompts are rendered with the profile's prompt
    format (chat template, system prompt), like the trajectories' prompts."""

    benchmark: Literal["embedded", "humaneval", "mbpp", "gsm8k", "math"] = "embedded"  # see evaluation/benchmarks.py
    source: str | None = None  # local JSONL/JSONL.gz/Parquet or hub id; None: the benchmark's hub id
    template: str | None = None  # prompt template for this model; None: the benchmark's default
    tune: TuneConfig = TuneConfig()
    num_prompts: int = Field(200, ge=1)  # accuracy, TPF and identity with greedy AR
    speed_prompts: int = Field(30, ge=1)  # TPS, every method taking turns
    speed_batch_size: int = Field(1, ge=1)
    repeats: int = Field(2, ge=1)  # timed runs per batch, fastest kept
    block_sizes: list[int] = [16, 32]
    max_new_tokens: int = Field(160, ge=1)
    batch_size: int = Field(32, ge=1)
    # Calibration prompts (choosing n, autotuning): the profile's prompt source, this split ("calib" for the embedded
    # task and for hash-split files; other file sources have no splits: their first prompts); `tune.prompts` of them.
    calibration_split: str | None = None
    # With prompts.hash_splits: evaluate on the benchmark rows of the prompt file in this hash split only (held out
    # from training and calibration by construction); `source` defaults to the prompt file.
    split: str | None = None
    _splits: tuple[dict[str, float], str] | None = PrivateAttr(default=None)  # (fractions, text field), set by Profile

    def held_out(self):
        """A filter over benchmark rows: those in `split` of the prompt file's hash splits (None: every row)."""
        if self.split is None or self._splits is None:
            return None
        from jf_core.trajectory.prompts import hash_split

        fractions, field = self._splits
        return lambda row: hash_split(str(row.get(field, "")), fractions) == self.split


class GateConfig(_Strict):
    """When a round's model becomes `champion` (it is always registered and aliased `challenger`); every check is
    in jf_core/evaluation/gate.py. Accuracy first, against the round's input and the lineage's original base (small
    drops would otherwise compound over rounds); TPF against the champion's at the same block size and decode
    config, on the same evaluation; and the outputs may not turn degenerate against the input model's."""

    max_accuracy_drop: float = 0.03  # against the round's input model, on the same evaluation set
    max_base_accuracy_drop: float = 0.05  # against the lineage's original base model, on the same evaluation set
    tpf_not_below_champion: bool = True  # TPF vs the champion's, compared only where block size and config match
    max_repetition_increase: float = Field(0.05, ge=0)  # repeated-n-gram fraction of the outputs, over the input's
    max_length_change: float = Field(0.25, ge=0)  # |mean output length / the input model's - 1|
    max_truncated_increase: float = Field(0.05, ge=0)  # fraction of outputs hitting max_new_tokens, over the input's


class RegistryConfig(_Strict):
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI if set, else sqlite under $JF_HOME/mlflow
    experiment: str = "jacobi-forcing"
    model_name: str | None = None  # None: "jf-<profile name>"
    ui_url: str | None = None  # for links from Prefect; None: the tracking URI when it is http(s)
    gate: GateConfig = GateConfig()


class StorageConfig(_Strict):
    runs_dir: str | None = None  # None: $JF_HOME/runs; rounds live under <runs_dir>/<profile>/<round key>


class RoundSpec(_Strict):
    block_size: int = Field(ge=1)
    window: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)  # later rounds start from a trained model: a gentler rate keeps accuracy

    def training_overrides(self) -> dict:
        return {k: v for k, v in {"window": self.window, "steps": self.steps, "lr": self.lr}.items() if v is not None}


class Profile(_Strict):
    name: str
    model: ModelConfig = ModelConfig()
    prompts: PromptSourceConfig = PromptSourceConfig()
    trajectory: TrajectoryConfig = TrajectoryConfig()
    compute: ComputeConfig = ComputeConfig()
    training: JFTrainConfig = JFTrainConfig()
    evaluation: EvalConfig = EvalConfig()
    rounds: list[RoundSpec] = []  # for `jf run --progressive`: growing block sizes, each from the previous model
    registry: RegistryConfig = RegistryConfig()
    storage: StorageConfig = StorageConfig()

    @property
    def model_name(self) -> str:
        return self.registry.model_name or f"jf-{self.name}"

    @model_validator(mode="after")
    def _held_out_split(self) -> Profile:
        e, p = self.evaluation, self.prompts
        if e.split is None:
            return self
        if not p.hash_splits or e.split not in p.hash_splits:
            raise ValueError(f"evaluation.split {e.split!r} needs prompts.hash_splits naming it (got {p.hash_splits})")
        if e.split == p.split:
            raise ValueError(f"evaluation.split {e.split!r} is the training split (prompts.split): hold one out")
        if e.source is None:
            e.source = p.source
        e._splits = (dict(p.hash_splits), p.text_field)
        return self

    @model_validator(mode="after")
    def _training_workers(self) -> Profile:
        if self.training.cpu_offload and self.training.strategy != "fsdp2":
            raise ValueError("training.cpu_offload needs training.strategy fsdp2 (FSDP2's CPUOffloadPolicy)")
        if self.training.strategy == "single" and self.compute.train_workers > 1:
            raise ValueError(
                f"compute.train_workers={self.compute.train_workers} needs training.strategy ddp or fsdp2 "
                "(strategy single trains in this process)"
            )
        # AR mixing was skipped without a word where it cannot apply: a round trained without what the profile says.
        if self.training.mix_ar_every and self.training.strategy != "single":
            raise ValueError(
                f"training.mix_ar_every={self.training.mix_ar_every} mixes AR batches in one training process: "
                f"strategy {self.training.strategy} replays each worker's share (set training.mix_ar_every=0)"
            )
        if self.training.mix_ar_every and self.prompts.source != "embedded":
            raise ValueError(
                f"training.mix_ar_every={self.training.mix_ar_every} mixes in the embedded task's true answers: "
                f"prompts.source {self.prompts.source!r} has none (set training.mix_ar_every=0)"
            )
        return self

    def runs_dir(self) -> Path:
        from jf_core.paths import jf_home

        return Path(self.storage.runs_dir).expanduser() if self.storage.runs_dir else jf_home() / "runs"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or "/" in value:
            raise ValueError(f"profile name must be a plain non-empty word, got {value!r}")
        return value


def _override_of(section: type[BaseModel]) -> type[BaseModel]:
    """A section's override: every field optional, no other field allowed. Values keep their types, so a typo'd
    name or a wrong type is refused by the schema; ranges and cross-field rules are checked by `load_profile`."""
    fields = {name: (f.annotation | None, None) for name, f in section.model_fields.items()}
    return create_model(f"{section.__name__}Override", __config__=ConfigDict(extra="forbid"), **fields)


# The `overrides` parameter of the flows: per-section partial configs. Its JSON schema becomes the deployments'
# parameter schema, so the Prefect server refuses a mistyped section or field when the run is created
# (`prefect deployment run ... --params`), naming it, instead of the worker failing later.
ProfileOverrides = create_model(
    "ProfileOverrides",
    __config__=ConfigDict(extra="forbid"),
    **{
        name: (_override_of(f.annotation) | None, None)
        for name, f in Profile.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    },
)


def overrides_dict(overrides: BaseModel | dict | None) -> dict[str, dict]:
    """Overrides as `load_profile` takes them: only what was given (a validated `ProfileOverrides` or a dict)."""
    if overrides is None:
        return {}
    if isinstance(overrides, BaseModel):
        return {k: v for k, v in overrides.model_dump(mode="json", exclude_unset=True).items() if v is not None}
    return {section: dict(values) for section, values in overrides.items()}


def merge_overrides(data: dict, overrides: dict) -> dict:
    """`overrides` into `data` in place, mapping into mapping: `{"evaluation": {"tune": {"prompts": 4}}}` changes
    one field of the profile's tune section and keeps the rest. A value of None leaves the field as it is."""
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            merge_overrides(data[key], value)
        else:
            data[key] = copy.deepcopy(value)  # later merges into `data` must not reach the caller's dicts
    return data


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str, **overrides: dict) -> Profile:
    """A profile by name (jf_core/profiles/NAME.yaml) or path; `overrides` ({section: {field: value}}) are merged
    field by field, nested sections too (`merge_overrides`)."""
    named = PROFILES_DIR / f"{name_or_path}.yaml"
    path = named if named.is_file() else Path(name_or_path)
    if not path.is_file():
        if path.suffix in (".yaml", ".yml"):
            raise ValueError(f"profile file {path} does not exist")
        raise ValueError(f"unknown profile {name_or_path!r}; available: {', '.join(available_profiles())}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(
            f"profile {path} must be a mapping of sections (name, model, training, ...), got a {type(data).__name__}"
        )
    merge_overrides(data, overrides)
    try:
        return Profile.model_validate(data)
    except Exception as err:
        raise ValueError(f"profile {path}: {err}") from err
