"""One typed config schema for the CLI, the flows' parameters and prefect.yaml.

A profile (YAML under jf_core/profiles/, or any path) names a model, a prompt source and the knobs of each stage.
`tiny` is the embedded default (CPU, minutes); real profiles (a 7B coder model on GPUs) use the same code.

Why one module of about 370 lines: it is the profile's schema, one class per YAML section in the order a profile is
read, and the loading that merges overrides into it; the sections whose knobs belong to one stage's implementation
(training, trajectories, prompt sources) already live beside it and are imported here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, field_validator, model_validator

from jf_core.paths import jf_home
from jf_core.training.config import JFTrainConfig
from jf_core.trajectory.config import TrajectoryConfig
from jf_core.trajectory.prompt_source import PromptSourceConfig, held_out_whole

PROFILES_DIR = Path(__file__).parent / "profiles"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(StrictModel):
    path: str = "embedded"  # local directory, hub id, or "embedded" (the model the package ships)
    # fp32: greedy Jacobi decoding is token-for-token greedy AR. bf16/fp16: every committed token is the argmax of
    # the forward that verified it, but a wide window and a one-token step run different kernels and near-tied
    # argmaxes can flip (measured and reported as the identical fraction): docs/decoding.md, "numerics".
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False  # code shipped with a checkpoint runs only when this is on
    lm_head_fp32: bool = (
        False  # decoding a bf16/fp16 model: fp32 logits, fewer argmax flips (layers/heads.py upcast_lm_head)
    )

    def decode_kwargs(self) -> dict:
        """load_model's placement and numerics for decoding this model (trajectories, evaluation, serving)."""
        return {
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
            "lm_head_fp32": self.lm_head_fp32,
        }


class ComputeConfig(StrictModel):
    workers: int = Field(2, ge=1)  # trajectory actors: one per GPU on GPU hosts, one per CPU slot here
    gpus_per_worker: float = Field(0, ge=0)  # per trajectory actor and per training worker
    cpus_per_worker: float = Field(1, gt=0)
    # Where the trajectory shards are made. ray: the actor pool. in_process: one model, shard after shard, in a
    # fresh process (jf_core/round/fresh.py). auto: in_process where the pool would be a single CPU actor on a
    # private Ray (one shard to make, one worker, or CPUs for one only: JF_CPUS=1), since that actor does the same
    # work after a Ray start and a model load of its own (docs/trajectories.md has what it saved); ray otherwise.
    trajectory_pool: Literal["auto", "ray", "in_process"] = "auto"
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


class TuneConfig(StrictModel):
    """Autotuning of the round's decode config (n, K, pool_size, r, ...) for TPS on this hardware."""

    enabled: bool = False
    prompts: int = Field(12, ge=1)  # calibration prompts
    # Each decode config field searched (JFDecodeConfig's names; one left out keeps its default) -> the values tried:
    # every combination, less those that decode alike (JFDecodeConfig.canonical: K = 1 ignores r, ...).
    grid: dict[str, list[bool | int | float]] = {
        "block_size": [16, 32, 64],
        "num_blocks": [1, 2, 3],  # K
        "pool_size": [0, 2, 4],
        "spawn_ratio": [0.5, 0.85],  # r
        "seed_drafts": [False, True],  # fresh drafts from recycled n-grams
        "adaptive_width": [False, True],  # narrow windows: less TPF, and less cost a forward where width costs
        "width_scale": [2.0],
        "width_margin": [2],
    }

    @field_validator("grid")
    @classmethod
    def _grid_of_decode_config_fields(cls, grid: dict[str, list]) -> dict[str, list]:
        from jf_core.decoding import JFDecodeConfig  # the knobs' one definition (imports torch, as tuning does)

        JFDecodeConfig.check_grid(grid)
        return grid

    repeats: int = Field(2, ge=1)  # runs per candidate, fastest kept: single runs let machine noise pick the winner
    # Successive halving (evaluation/tune.py `tune`): the prompts in this many slices, the slower half of the
    # configurations stopping after each slice but the last; 1: every configuration decodes every prompt.
    rungs: int = Field(1, ge=1)
    # Tokens each calibration prompt decodes while tuning (None: evaluation.max_new_tokens): where a forward costs
    # tens of milliseconds (a real model on a CPU), a shorter decode keeps the grid to minutes.
    max_new_tokens: int | None = Field(None, ge=1)
    # AR against the winner at these batch sizes: the crossover above which a server should run AR (stored in the
    # model's jacobi_forcing block); empty to skip.
    crossover_batch_sizes: list[int] = [1, 2, 4, 8, 16, 32]


class EvalConfig(StrictModel):
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
    # More runs (methods still taking turns) until each method has spent this long timed, in every timed pass: the
    # speed pass, the block size's calibration and the tune's crossover. A few batches of milliseconds (a small model
    # at batch 16) are too short to time; 0 keeps `repeats` runs (tests, which assert behaviour, not speed).
    min_timed_seconds: float = Field(0.0, ge=0)
    block_sizes: list[int] = [16, 32]
    max_new_tokens: int = Field(160, ge=1)
    batch_size: int = Field(32, ge=1)
    # Calibration prompts (choosing n, autotuning): the profile's prompt source, this split ("calib" for the embedded
    # task and for hash-split files; other file sources have no splits: their first prompts); `tune.prompts` of them.
    calibration_split: str | None = None
    # With prompts.hash_splits: evaluate on the benchmark rows of the prompt file in this hash split only (held out
    # from training and calibration by construction); `source` defaults to the prompt file (another is read whole).
    split: str | None = None
    # An AR-against-AR control row in every timed pass (`ar_control`): our AR timed twice, taking turns like every
    # method, so its ratio (ideally 1.00) shows the timer's order bias and spread beside the figures it qualifies.
    control: bool = True
    # A trained model's evaluation in a round also decodes its input model (the untrained base, in a first round) by
    # what a user would pick instead of training: HF prompt lookup, and our decoder with the config the same tune
    # found on that model (`base_*` rows, taking turns with the trained model's). The gate holds the trained model
    # to the best of them (registry.gate.untrained_margin).
    untrained: bool = True
    # Tunes and evaluations run in a process started for them (jf_core/round/fresh.py): in the process that had just
    # trained, every drafter timed 5-20% slower against AR than in a new one at the same moment (2026-12-03), so the
    # tune's choice and the gate's verdict followed the round's history. false: in the caller's process (a few
    # seconds less per stage, for a tiny model where timings decide nothing).
    fresh_process: bool = True

    _splits: tuple[dict[str, float], str] | None = PrivateAttr(default=None)  # (fractions, text field), set by Profile

    @property
    def hash_splits(self) -> tuple[dict[str, float], str] | None:
        """The prompt file's hash splits and the text field they hash (set by the profile): `split` selects rows."""
        return self._splits

    @property
    def one_pass(self) -> bool:
        """One pass serves quality and speed: the speed prompts are every prompt, at the evaluation's batch size."""
        return self.speed_prompts >= self.num_prompts and self.speed_batch_size == self.batch_size

    @property
    def reads_input_model(self) -> bool:
        """A trained model's evaluation also makes its input model's (`Evaluation.input_evaluation`): every row is
        scored in its one pass and plain Jacobi has one block size (none to choose on calibration prompts), so the
        untrained anchors' AR and plain Jacobi rows are what an evaluation of the input model of its own would
        measure, timed in the same run."""
        return self.untrained and self.one_pass and len(self.block_sizes) == 1


class GateConfig(StrictModel):
    """When a round's model becomes `champion` (it is always registered and aliased `challenger`); every check is
    in jf_core/evaluation/gate.py. Accuracy first, against the round's input and the lineage's original base (small
    drops would otherwise compound over rounds); TPF against the champion's at the same block size and decode
    config, on the same evaluation; decoding not slower than the model's own AR, and faster than the best untrained
    decoding of its input model; and the outputs may not turn degenerate against the input model's."""

    max_accuracy_drop: float = 0.03  # against the round's input model, on the same evaluation set
    max_base_accuracy_drop: float = 0.05  # against the lineage's original base model, on the same evaluation set
    tpf_not_below_champion: bool = True  # TPF vs the champion's, compared only where block size and config match
    # The headline's tokens/s over our AR's, in the same evaluation, taking turns: what a consumer's decoding (the
    # tuned config through its dispatch) delivers. A model slower than AR beyond the timing's spread is refused;
    # 0.9 leaves room for the spread of a few speed prompts on a busy CPU (an AR-dispatched model measures ~1.0).
    # None: not checked.
    min_speedup_vs_ar: float | None = Field(0.9, gt=0)
    # The headline's tokens/s over the best untrained anchor's (evaluation.untrained), in the same run: a trained
    # model must be faster than what a user gets without training by more than the timing's spread, the larger of
    # this floor and the widest |x - 1| of the run's AR-against-AR pairs (Evaluation.timing_spread), and with the
    # lower end of its 95% interval over resampled prompts above 1 where known (gate.py). None, or a profile whose
    # evaluation.untrained is off: not checked (`Profile.gate`).
    untrained_margin: float | None = Field(0.03, ge=0)
    max_repetition_increase: float = Field(0.05, ge=0)  # repeated-n-gram fraction of the outputs, over the input's
    max_length_change: float = Field(0.25, ge=0)  # |mean output length / the input model's - 1|
    max_truncated_increase: float = Field(0.05, ge=0)  # fraction of outputs hitting max_new_tokens, over the input's


class RegistryConfig(StrictModel):
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI if set, else sqlite under $JF_HOME/mlflow
    experiment: str = "jacobi-forcing"
    model_name: str | None = None  # None: "jf-<profile name>"
    ui_url: str | None = None  # for links from Prefect; None: the tracking URI when it is http(s)
    gate: GateConfig = GateConfig()


class StorageConfig(StrictModel):
    runs_dir: str | None = None  # None: $JF_HOME/runs; rounds live under <runs_dir>/<profile>/<round key>


class RoundSpec(StrictModel):
    block_size: int = Field(ge=1)
    window: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)  # later rounds start from a trained model: a gentler rate keeps accuracy

    def training_overrides(self) -> dict:
        return {k: v for k, v in {"window": self.window, "steps": self.steps, "lr": self.lr}.items() if v is not None}


class Profile(StrictModel):
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

    @property
    def gate(self) -> GateConfig:
        """The gate this profile's rounds pass: `registry.gate`, without the check against the untrained anchors
        where the evaluation does not time them (`evaluation.untrained: false`, the one way to turn it off from
        `--set`, which cannot set a null)."""
        gate = self.registry.gate
        return gate if self.evaluation.untrained else gate.model_copy(update={"untrained_margin": None})

    def worker_device(self) -> str:
        """Where a Ray worker of this profile runs its model: CUDA when Ray gives it GPUs, else the model's device
        (`auto` is the CPU there: a worker without GPUs has none to find). One process's own device is
        jf_core.models.resolve_device."""
        if self.compute.gpus_per_worker > 0:
            return "cuda"
        return "cpu" if self.model.device == "auto" else self.model.device

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
        if not held_out_whole(p, e.source):
            e._splits = (dict(p.hash_splits), p.text_field)
        return self

    @model_validator(mode="after")
    def _text_needs_answers(self) -> Profile:
        if self.trajectory.kind == "text" and self.prompts.answer_field is None:
            raise ValueError(
                "trajectory.kind text trains on the prompt file's reference answers: name their field in "
                "prompts.answer_field (GSM8K: answer)"
            )
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


def parse_overrides(items: list[str]) -> dict[str, dict]:
    """`--set` items, `section.key=value` or deeper (`evaluation.tune.prompts=4`) -> {section: {key: ...}} for
    `load_profile` (which merges them with `merge_overrides`); the value parsed as JSON when it parses, else text."""
    out: dict[str, dict] = {}
    for item in items:
        path, sep, raw = item.partition("=")
        keys = path.split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ValueError(f"--set expects section.key=value, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if value is None:  # merge_overrides reads None as "not given": refused, not silently dropped
            raise ValueError(f"--set {item!r}: null cannot be set here (an override of None leaves the field as it is)")
        node = out
        for depth, key in enumerate(keys[:-1]):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {'.'.join(keys[: depth + 1])} was set to a value, not fields")
        node[keys[-1]] = value
    return out


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
