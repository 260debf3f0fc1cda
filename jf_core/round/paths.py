"""Where a round lives and what names it: directories keyed by everything that determines their content.

Layout of a round, keyed by everything that determines its model (input model, prompts, trajectory and training
configs; not the evaluation or the gate):

    <runs_dir>/<profile>/n<block>-<key>/{trajectories -> shared store, packed/, checkpoints/, model/}
    <runs_dir>/<profile>/trajectories/n<block>-<key>/   (keyed by model, prompts and trajectory config only: rounds
                                                         that differ in training alone, e.g. ablations, share it)
    <runs_dir>/evals/<model fingerprint>-<eval config hash>.json   (shared: a base model is evaluated once)
    <runs_dir>/tunes/<model fingerprint>-<tune config hash>.json   (an untrained model's tune, for its anchor rows)

Each stage writes, last, a `done.json` marker (atomically) holding its result (jf_core/round/results.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from jf_core.config import Profile
from jf_core.model_dir import model_fingerprint


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
    def examples(self) -> Path:
        """The packed training examples, one parquet file."""
        return self.packed / "examples.parquet"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"


def model_identity(path: str) -> str:
    """A model as keys see it: a local directory by its content (jf_core/model_dir.py), a hub id by its name."""
    local = Path(path).expanduser()
    return model_fingerprint(local) if local.is_dir() else hashlib.sha256(path.encode()).hexdigest()[:16]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def prompts_identity(profile: Profile) -> dict:
    """The prompt config as round and trajectory keys see it: without `extra_sources` while it is empty, so the
    keys of profiles written before it existed are unchanged."""
    return profile.prompts.identity()


def training_identity(profile: Profile) -> dict:
    """The training config as round keys see it: every field but the TPF probe's, which reads the model and changes
    nothing in it, and how many checkpoints are kept; `compute_dtype`, `packing`, `attention`, `draft_corpus` and
    `guessed_weight` only where they are not their defaults (rounds trained before they existed keep their keys)."""
    probe = {"tpf_probe_every", "tpf_probe_questions", "tpf_probe_prompts", "tpf_probe_tokens", "tpf_probe_block_sizes"}
    t = profile.training
    unset = {"compute_dtype"} if t.compute_dtype == "model" else set()
    unset |= {"packing"} if t.packing == "blocks" else set()
    unset |= {"attention"} if t.attention == "auto" else set()
    unset |= {"draft_corpus"} if t.draft_corpus else set()
    unset |= {"guessed_weight"} if t.guessed_weight == 1 else set()
    return profile.training.model_dump(exclude=probe | unset | {"keep_checkpoints"})


def trajectory_identity(profile: Profile) -> dict:
    """The trajectory config as keys see it, with the record schema's version: trajectories stored under another
    schema (schema 1 had no `kind`) are another store, generated again rather than mixed."""
    from jf_core.trajectory.schema import SCHEMA_VERSION

    return {**profile.trajectory.model_dump(), "schema": SCHEMA_VERSION}


def trajectory_dir(profile: Profile, model_in: str) -> Path:
    key = _digest(
        {
            "model": model_identity(model_in),
            "prompts": prompts_identity(profile),
            "trajectory": trajectory_identity(profile),
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
            "trajectory": trajectory_identity(profile),
            "training": training_identity(profile),
        }
    )
    return profile.runs_dir() / profile.name / f"n{profile.trajectory.block_size}-{key}"


def eval_path(profile: Profile, model_path: str, anchors: object = None) -> Path:
    """A model's evaluation under this profile: shared by rounds (a base model is evaluated once), keyed by the
    model's content, the evaluation config, the model's stored decode config and its untrained `anchors` (what
    they decode: the input model's identity and the config tuned on it)."""
    from jf_core.model_dir import saved_decode_config

    tuned = saved_decode_config(model_path)
    parts = [profile.evaluation.model_dump(), tuned] + ([anchors] if anchors is not None else [])
    key = f"{model_identity(model_path)}-{_digest(parts)}"
    return profile.runs_dir() / "evals" / f"{key}.json"


def untrained_tune_path(profile: Profile, model_path: str) -> Path:
    """The tune of a model a round trains from (its anchors' decode config), kept outside the model, which may be
    read-only or shared: keyed by the model's content, the tune config, the length it decodes at, the numerics and
    where it is timed."""
    e = profile.evaluation
    # fresh_process too: a tune timed in a process that had trained (before 2026-12-03) is not reused
    key = _digest(
        [e.tune.model_dump(), e.max_new_tokens, e.calibration_split, profile.model.decode_kwargs(), e.fresh_process]
    )
    return profile.runs_dir() / "tunes" / f"{model_identity(model_path)}-{key}.json"


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
