"""The stages of a round as plain functions over paths: trajectories -> pack -> train -> evaluate.

Each stage writes under its own directory and, last, a `done.json` marker (atomically) holding its result. A stage
whose marker exists returns that result and does no work, so a re-run, a retried task or a resumed flow reuses
every finished stage. The Prefect flow (flows/round.py) calls these.

Layout of a round, keyed by everything that determines its model (input model, prompts, trajectory and training
configs; not the evaluation or the gate):

    <runs_dir>/<profile>/n<block>-<key>/{trajectories -> shared store, packed/, checkpoints/, model/}
    <runs_dir>/<profile>/trajectories/n<block>-<key>/   (keyed by model, prompts and trajectory config only: rounds
                                                         that differ in training alone, e.g. ablations, share it)
    <runs_dir>/evals/<model fingerprint>-<eval config hash>.json   (shared: a base model is evaluated once)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from jacobi_forcing.tasks.trajectories import model_identity
from jf_core.config import Profile

log = logging.getLogger("jf.stages")
DONE = "done.json"


@dataclass(frozen=True)
class RoundPaths:
    root: Path

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def packed(self) -> Path:
        return self.root / "packed"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, default=str)
    os.replace(tmp, path)


def finished(stage_dir: Path) -> dict | None:
    marker = Path(stage_dir) / DONE
    return json.loads(marker.read_text()) if marker.is_file() else None


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def prompts_identity(profile: Profile) -> dict:
    """The prompt config as round and trajectory keys see it: without `extra_sources` while it is empty, so the
    keys of profiles written before it existed are unchanged."""
    return profile.prompts.identity()


def training_identity(profile: Profile) -> dict:
    """The training config as round keys see it: without `method` while it is the default, so rounds trained
    before the CLLM baseline existed keep their keys."""
    training = profile.training.model_dump(exclude={"tpf_probe_every", "tpf_probe_prompts", "tpf_probe_tokens"})
    if training["method"] == "jacobi_forcing":
        del training["method"]
    return training


def trajectory_dir(profile: Profile, model_in: str) -> Path:
    key = _digest(
        {
            "model": model_identity(model_in),
            "prompts": prompts_identity(profile),
            "trajectory": profile.trajectory.model_dump(),
        }
    )
    return profile.runs_dir() / profile.name / "trajectories" / f"n{profile.trajectory.block_size}-{key}"


def round_paths(profile: Profile, model_in: str) -> RoundPaths:
    """The round's directory, its `trajectories` a link into the shared trajectory store (made on first use)."""
    root = round_dir(profile, model_in)
    link = root / "trajectories"
    if not link.exists() and not link.is_symlink():
        shared = trajectory_dir(profile, model_in)
        shared.mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(shared, root), target_is_directory=True)
    return RoundPaths(root)


def round_dir(profile: Profile, model_in: str) -> Path:
    key = _digest(
        {
            "model": model_identity(model_in),
            "prompts": prompts_identity(profile),
            "trajectory": profile.trajectory.model_dump(),
            "training": training_identity(profile),
        }
    )
    return profile.runs_dir() / profile.name / f"n{profile.trajectory.block_size}-{key}"


def stage_trajectories(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    *,
    progress: bool = True,
    on_shard: Callable[[int, int], None] | None = None,
) -> dict:
    """Jacobi trajectories of `model_in` over the profile's prompts (Ray actor pool; resumes by shard)."""
    from jacobi_forcing.tasks.trajectories import generate_trajectories

    if (done := finished(paths.trajectories)) is not None:
        log.info("reusing finished trajectories at %s (%s rows)", paths.trajectories, done["rows"])
        return done
    round_profile = profile.model_copy(update={"model": profile.model.model_copy(update={"path": model_in})})
    summary = generate_trajectories(round_profile, paths.trajectories, progress=progress, on_shard=on_shard)
    result = {**asdict(summary), "tokens_per_second": summary.tokens_per_second}
    write_json_atomic(paths.trajectories / DONE, result)
    return result


def stage_pack(profile: Profile, paths: RoundPaths) -> dict:
    """[prompt][noisy_0][clean_0]... examples under the profile's noise schedule -> packed/examples.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jf_core.training.noise import ratio_profile
    from jf_core.training.packing import pack_records
    from jf_core.trajectory.store import TrajectoryStore

    if (done := finished(paths.packed)) is not None:
        log.info("reusing packed examples at %s (%s examples)", paths.packed, done["examples"])
        return done
    t = profile.training
    records = TrajectoryStore(paths.trajectories).read().to_pylist()
    schedule = t.noise_schedule()
    packed, stats = pack_records(records, schedule, t.max_length)
    if not packed:
        raise ValueError(f"packing {paths.trajectories} produced no examples (dropped: {dict(stats.dropped_blocks)})")
    paths.packed.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".examples.", suffix=".parquet.tmp", dir=paths.packed)
    os.close(fd)
    pq.write_table(pa.Table.from_pylist([asdict(e) for e in packed]), tmp)
    os.replace(tmp, paths.packed / "examples.parquet")
    result = {
        "examples": stats.examples,
        "blocks": stats.blocks,
        "dropped_blocks": dict(stats.dropped_blocks),
        "noise": ratio_profile(records, schedule),  # what the schedule made of these answers
    }
    write_json_atomic(paths.packed / DONE, result)
    return result


def noise_profile(profile: Profile, paths: RoundPaths) -> dict:
    """What the profile's noise schedule makes of the round's trajectories (jf_core/training/noise.py)."""
    from jf_core.training.noise import ratio_profile
    from jf_core.trajectory.store import TrajectoryStore

    return ratio_profile(TrajectoryStore(paths.trajectories).read().to_pylist(), profile.training.noise_schedule())


def load_packed(paths: RoundPaths):
    import pyarrow.parquet as pq

    from jf_core.training.packing import PackedExample

    return [PackedExample(**row) for row in pq.read_table(paths.packed / "examples.parquet").to_pylist()]


def stage_train(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    *,
    progress: bool = True,
    on_log: Callable[[int, dict], None] | None = None,
) -> dict:
    """Jacobi Forcing training from `model_in` on the packed examples -> model/ (safetensors + tokenizer, in the
    model's dtype). `training.strategy` single runs here; ddp and fsdp2 run on Ray Train workers
    (tasks/train_distributed.py), through the same loop.

    Checkpoints (weights + optimizer) every `training.checkpoint_every` steps let a retried task or a restarted
    worker resume where it died; they are removed once the model directory is complete."""
    if (done := finished(paths.model)) is not None:
        log.info("reusing trained model at %s (%s steps)", paths.model, done["steps"])
        return done
    if profile.training.strategy != "single":
        from jacobi_forcing.tasks.train_distributed import train_distributed

        summary = train_distributed(profile, paths, model_in, on_log=on_log)
    else:
        summary = _train_here(profile, model_in, paths, progress=progress, on_log=on_log)
    shutil.rmtree(paths.checkpoints, ignore_errors=True)
    return summary


def _train_here(profile: Profile, model_in: str, paths: RoundPaths, *, progress: bool, on_log) -> dict:
    import torch

    from jf_core.checkpoint import save_model_dir
    from jf_core.models import ModelSpec, load_model
    from jf_core.serving.artifact import lineage
    from jf_core.threads import ThreadGovernor
    from jf_core.toy.task import make_split
    from jf_core.training.jf_data import jf_batches
    from jf_core.training.losses import check_lean_head, training_attention
    from jf_core.training.trainer import train

    t = profile.training
    examples = load_packed(paths)
    device = torch.device("cuda" if torch.cuda.is_available() and profile.model.device in ("auto", "cuda") else "cpu")
    compute = ModelSpec(model_in, dtype=profile.model.dtype, device=str(device)).resolved_dtype()
    attention = training_attention(device)
    # fp32 master weights: the optimizer never steps bf16 weights; compute runs in the model's dtype (autocast).
    model, tok = load_model(model_in, dtype="float32", device=str(device), attn_implementation=attention)
    if t.activation_checkpointing:
        from jf_core.training.parallel import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    ar_mix = None
    if t.mix_ar_every and profile.prompts.source == "embedded":
        from jf_core.toy.data import ar_batches

        ar_mix = ar_batches(tok, make_split("train", 20_000), t.batch_size, t.seed)
    batches = jf_batches(
        examples,
        t.batch_size,
        tok.pad_token_id,
        seed=t.seed,
        variant=t.mask,
        ar_batches=ar_mix,
        ar_every=t.mix_ar_every,
        dense_mask=attention != "flex_attention",
    )
    objective = t.objective()
    # On CPU one thread count for the whole run, so the model does not follow the machine's load (jf_core/threads.py);
    # on GPU the count hardly matters and is left alone.
    c = profile.compute
    threads = ThreadGovernor.for_training(c.threads, c.adaptive_threads) if device.type == "cpu" else None
    if t.lean_loss:
        check_lean_head(model, next(jf_batches(examples, 1, tok.pad_token_id, seed=t.seed, variant=t.mask)), t.mask)
    result = train(
        model.train(),
        batches,
        objective,
        t.loop(compute_dtype=str(compute).removeprefix("torch.")),
        progress=progress,
        on_log=on_log,
        checkpoint_dir=paths.checkpoints,
        checkpoint_every=t.every(),
        threads=threads,
        probe=tpf_probe(profile, model, tok) if t.tpf_probe_every else None,
        probe_every=t.tpf_probe_every or 0,
    )
    summary = {
        "steps": result.steps,
        "train_seconds": result.seconds,
        "model_in": model_in,
        "strategy": "single",
        "resumed_from_step": result.resumed_from,
        "threads": result.threads,
        "history": result.history,
    }
    if result.resumed_from:
        log.info("training resumed from its checkpoint at step %d of %d", result.resumed_from, result.steps)
    save_model_dir(
        model,
        paths.model,
        tokenizer=tok,
        dtype=compute,
        extra_files={DONE: json.dumps(summary, indent=2)},
        block={"lineage": lineage(model_in)},
    )
    return summary


def tpf_probe(profile: Profile, model, tokenizer) -> Callable:
    """TPF of the model being trained: plain Jacobi at the round's block size on a few calibration prompts (never
    the test set), greedy, fp32 (training's masters; no autocast)."""
    import torch

    from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
    from jf_core.models import stop_tokens
    from jf_core.trajectory.prompts import calibration_prompts

    t = profile.training
    prompts = calibration_prompts(profile.prompts, tokenizer, t.tpf_probe_prompts, profile.evaluation.calibration_split)
    cfg = JacobiConfig(block_size=profile.trajectory.block_size, max_new_tokens=t.tpf_probe_tokens)
    stop = stop_tokens(model, tokenizer)

    def probe(m) -> dict[str, float]:
        with torch.no_grad():
            stats = jacobi_decode(m, prompts, cfg, **stop).stats
        return {f"probe_tpf_n{cfg.block_size}": stats.tpf}

    return probe


def stage_tune(profile: Profile, model_dir: Path, progress: Callable[[str], None] | None = None) -> dict | None:
    """Autotune the model's decode config on calibration prompts, measure AR's crossover batch size, and write both
    into the `jacobi_forcing` block of the model's config.json (when enabled). `progress(line)` hears how far it is
    (a grid of configurations takes minutes even on the toy)."""
    from jf_core.decoding.config_io import save_decode_config
    from jf_core.evaluation.tune import store_crossover, tune
    from jf_core.models import load_model, stop_tokens
    from jf_core.trajectory.prompts import calibration_prompts

    cfg = profile.evaluation.tune
    if not cfg.enabled:
        return None
    done = Path(model_dir) / "decode_tuning.json"
    say = progress or log.info
    if done.is_file():
        say(f"reusing the tuned decode config of {model_dir}")
        return json.loads(done.read_text())
    model, tok = load_model(str(model_dir), **profile.model.decode_kwargs())
    prompts = calibration_prompts(profile.prompts, tok, cfg.prompts, profile.evaluation.calibration_split)
    space, new_tokens = cfg.space(), profile.evaluation.max_new_tokens
    grid = f"tuning {len(space.configs(new_tokens))} decode configs on {len(prompts)} prompts"
    best, trials = tune(
        model,
        prompts,
        **stop_tokens(model, tok),
        max_new_tokens=new_tokens,
        space=space,
        repeats=cfg.repeats,
        say=lambda line: say(f"{grid}: {line}"),
    )
    report = {"best": asdict(best), "calibration_prompts": len(prompts), "trials": [asdict(t) for t in trials]}
    save_decode_config(model_dir, best)
    report["serving"] = store_crossover(
        model,
        tok,
        prompts,
        best,
        model_dir,
        cfg.crossover_batch_sizes,
        repeats=cfg.repeats,
        progress=lambda b, x, tpf: say(f"crossover: batch {b}: Jacobi {x:.2f}x AR (TPF {tpf:.2f})"),
    )
    write_json_atomic(done, report)  # last: its presence means the whole step is done
    return report


def eval_path(profile: Profile, model_path: str) -> Path:
    from jf_core.decoding.config_io import saved_decode_config

    tuned = saved_decode_config(model_path)
    key = f"{model_identity(model_path)}-{_digest([profile.evaluation.model_dump(), tuned])}"
    return profile.runs_dir() / "evals" / f"{key}.json"


EVAL_FORMAT = 2  # 2: evaluations carry `output_stats` (the gate's degeneracy checks)


def eval_key(profile: Profile) -> str:
    """What makes two models' figures comparable: the same evaluation set, prompt format, lengths and batch, in the
    same numerics (the speed-only knobs and the tuner do not change TPF or accuracy). The gate compares TPF with the
    champion's only under the same key."""
    e = profile.evaluation
    measured = e.model_dump(include={"benchmark", "source", "template", "num_prompts", "max_new_tokens", "batch_size"})
    # Prompt files merged into training (prompts.extra_sources) change what a model learns from, not how it is
    # measured: a round triggered by new prompts stays comparable with the champion's figures.
    prompts = profile.prompts.identity(exclude={"extra_sources"})
    return _digest([measured, prompts, profile.model.decode_kwargs()])


@contextmanager
def eval_threads(profile: Profile) -> Iterator[int]:
    """One thread count for a whole evaluation (its methods take turns: a count changed between turns would bias
    the ratios): compute.threads, else the CPUs free of other processes when it starts. The caller's count is put
    back after, so the next task in this process (a worker runs several) starts from its own."""
    import torch

    from jf_core.threads import choose_threads

    before = torch.get_num_threads()
    torch.set_num_threads(profile.compute.threads or choose_threads())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def stage_evaluate(profile: Profile, model_path: str, *, progress: Callable[[str], None] | None = None) -> dict:
    """Accuracy, TPF, identity with greedy AR and TPS (every method taking turns) of one model
    (jf_core/evaluation/evaluate.py); cached per (model, evaluation config). `progress` gets a line per batch
    (default: this module's log)."""
    from jf_core.evaluation.evaluate import evaluate_profile

    out = eval_path(profile, model_path)
    if out.is_file():
        cached = json.loads(out.read_text())
        if "output_stats" in cached:  # evaluations from before EVAL_FORMAT 2 are redone
            log.info("reusing evaluation %s", out)
            return cached
    with eval_threads(profile) as threads:
        result = evaluate_profile(model_path, profile, progress=progress or log.info)
    result["model"] = model_path
    result["torch_threads"] = threads
    write_json_atomic(out, result)
    return result


def round_report(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    stages: dict,
    base: dict,
    jf: dict,
    lineage_base: tuple[str, dict] | None = None,
) -> dict:
    """The round's result: the same names in report.json, MLflow, the Prefect artifacts and the CLI table. The
    headline is the evaluation's: the tuned decode config when there is one, else plain Jacobi at the block size
    chosen on calibration prompts; its speedup is against our AR on the same model. `base` is the input model's
    evaluation; `lineage_base` the chain's original base model and its evaluation (None: the input is the base).
    `figures` are what the gate reads of each (jf_core/evaluation/gate.py)."""
    from jf_core.evaluation.gate import Figures

    tuned = jf["methods"].get("tuned")
    headline = jf["methods"][jf["headline_method"]]
    key = eval_key(profile)
    origin, origin_eval = lineage_base or (model_in, base)
    return {
        "eval_key": key,
        "lineage_base": origin,
        "lineage_base_accuracy": origin_eval["accuracy"],
        "figures": {
            "candidate": asdict(Figures.of(jf, key)),
            "input": asdict(Figures.of(base, key)),
            "lineage_base": asdict(Figures.of(origin_eval, key)),
        },
        "output_stats": jf["output_stats"],
        "base_output_stats": base["output_stats"],
        "profile": profile.name,
        "model_in": model_in,
        "model": str(paths.model),
        "round_dir": str(paths.root),
        "block_size": profile.trajectory.block_size,
        "base_accuracy": base["accuracy"],
        "base_tpf": base["tpf"],
        "accuracy": jf["accuracy"],
        "tpf": jf["tpf"],
        "tps": jf["tps"],
        "headline_tpf": headline["tpf"],
        "headline_tps": headline["tps"],
        "speedup_vs_ar": jf["speedup_vs_ar"],
        "speedup_vs_hf_generate": jf["speedup_vs_hf_generate"],
        "speedup_block_size": jf["speedup_block_size"],
        "dtype": jf["dtype"],
        "identical_fraction": headline["identical_fraction"],  # with the model's greedy AR; 1.0 in fp32 by contract
        "decode_config": jf["decode_config"],
        "tuned": None
        if tuned is None
        else {k: tuned[k] for k in ("tpf", "tps", "speedup_vs_ar", "identical_fraction")}
        | {"config": jf["decode_config"]},
        "train_seconds": stages["train"]["train_seconds"],
        "resumed_from_step": stages["train"].get("resumed_from_step", 0),
        # torch CPU threads each stage ran with: the training governor's counts, the evaluation's one count, and the
        # trajectory actors' (their Ray CPU allotment). Logged as the run's params.
        "threads": {
            "train": stages["train"].get("threads") or {},
            "eval": jf.get("torch_threads"),
            "trajectory_actor": max(1, int(profile.compute.cpus_per_worker)),
        },
        "trajectories": {k: v for k, v in stages["trajectories"].items()},
        "packing": stages["pack"],
        "training": profile.training.model_dump(),
        "loss_curve": stages["train"]["history"],
        "base_eval": base,
        "eval": jf,
    }
