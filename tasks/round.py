"""One Jacobi Forcing round, end to end: model in -> trajectories (Ray pool) -> pack -> train -> evaluate -> model out.

Everything a round makes lives under its directory: trajectories/, model/ (safetensors + tokenizer), report.json.
A finished stage is not redone: trajectories resume by shard key, and a round whose model/ and report.json exist is
returned as is.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from jf_core.checkpoint import save_checkpoint
from jf_core.config import Profile
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.models import load_model
from jf_core.toy.evaluate import evaluate
from jf_core.toy.task import make_split
from jf_core.training.jf_data import jf_batches
from jf_core.training.losses import training_attention
from jf_core.training.packing import pack_records
from jf_core.training.trainer import train
from jf_core.trajectory.store import TrajectoryStore
from tasks.trajectories import generate_trajectories


def evaluate_model(model_path: str, profile: Profile) -> dict:
    """Accuracy (greedy, exact match on the embedded task's test split), TPF per block size, and TPS of Jacobi vs
    AR on the same model at batch 1, measured side by side."""
    cfg = profile.evaluation
    model, tok = load_model(model_path, dtype=profile.model.dtype)
    examples = make_split("test", cfg.num_prompts)
    eos, pad = tok.eos_token_id, tok.pad_token_id

    def ar(prompts):
        return ar_decode(model, prompts, max_new_tokens=cfg.max_new_tokens, eos_token_id=eos, pad_token_id=pad)

    result = {"accuracy": evaluate(tok, examples, ar, batch_size=cfg.batch_size).accuracy, "tpf": {}, "tps": {}}
    speed_set = examples[: cfg.speed_prompts]
    ar_speed = evaluate(tok, speed_set, ar, batch_size=1)
    result["tps"]["ar"] = ar_speed.stats.tps
    for n in cfg.block_sizes:
        jcfg = JacobiConfig(block_size=n, max_new_tokens=cfg.max_new_tokens)

        def jac(prompts, jcfg=jcfg):
            return jacobi_decode(model, prompts, jcfg, eos_token_id=eos, pad_token_id=pad)

        full = evaluate(tok, examples, jac, batch_size=cfg.batch_size)
        if full.accuracy != result["accuracy"]:
            raise AssertionError(f"Jacobi n={n} changed the answers: {full.accuracy} vs AR {result['accuracy']}")
        result["tpf"][str(n)] = full.stats.tpf
        result["accepted_histogram_" + str(n)] = full.stats.accepted_histogram()
        result["tps"][f"jacobi_n{n}"] = evaluate(tok, speed_set, jac, batch_size=1).stats.tps
    best = max(cfg.block_sizes, key=lambda n: result["tps"][f"jacobi_n{n}"])
    result["speedup_vs_ar"] = result["tps"][f"jacobi_n{best}"] / result["tps"]["ar"]
    result["speedup_block_size"] = best
    return result


def run_round(
    profile: Profile,
    out: str | Path,
    *,
    model_in: str | None = None,
    base_eval: dict | None = None,
    trajectories_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """`trajectories_dir` shares one trajectory store between rounds with the same model and block size (the
    ablations); by default trajectories live in the round's own directory."""
    out = Path(out)
    report_path = out / "report.json"
    if report_path.is_file() and (out / "model" / "config.json").is_file():
        return json.loads(report_path.read_text())
    started = time.perf_counter()
    model_in = model_in or profile.model.resolve()
    t = profile.training
    round_profile = profile.model_copy(update={"model": profile.model.model_copy(update={"path": model_in})})
    trajectories = Path(trajectories_dir) if trajectories_dir is not None else out / "trajectories"
    summary = generate_trajectories(round_profile, trajectories, progress=progress)
    records = TrajectoryStore(trajectories).read().to_pylist()
    packed, pack_stats = pack_records(records, t.noise_schedule(), t.max_length)

    device = torch.device("cuda" if torch.cuda.is_available() and profile.model.device in ("auto", "cuda") else "cpu")
    model, tok = load_model(
        model_in, dtype=profile.model.dtype, device=str(device), attn_implementation=training_attention(device)
    )
    ar_mix = None
    if t.mix_ar_every and profile.prompts.source == "embedded":
        from jf_core.toy.data import ar_batches

        ar_mix = ar_batches(tok, make_split("train", 20_000), t.batch_size, t.seed)
    batches = jf_batches(
        packed, t.batch_size, tok.pad_token_id, seed=t.seed, variant=t.mask, ar_batches=ar_mix, ar_every=t.mix_ar_every
    )
    result = train(model.train(), batches, t.objective(), t.loop(), progress=progress)
    save_checkpoint(model, out / "model", tokenizer=tok)

    base_eval = base_eval or evaluate_model(model_in, profile)
    jf_eval = evaluate_model(str(out / "model"), profile)
    report = {
        "profile": profile.name,
        "model_in": model_in,
        "block_size": profile.trajectory.block_size,
        "base_accuracy": base_eval["accuracy"],
        "base_tpf": base_eval["tpf"],
        "accuracy": jf_eval["accuracy"],
        "tpf": jf_eval["tpf"],
        "tps": jf_eval["tps"],
        "speedup_vs_ar": jf_eval["speedup_vs_ar"],
        "speedup_block_size": jf_eval["speedup_block_size"],
        "train_seconds": result.seconds,
        "round_seconds": time.perf_counter() - started,
        "trajectories": asdict(summary),
        "packing": {
            "examples": pack_stats.examples,
            "blocks": pack_stats.blocks,
            "dropped_blocks": dict(pack_stats.dropped_blocks),
        },
        "training": t.model_dump(),
        "loss_curve": result.history,
        "base_eval": base_eval,
        "eval": jf_eval,
    }
    report_path.write_text(json.dumps(report, indent=2, default=str))
    return report


def run_rounds(profile: Profile, out: str | Path, *, progress: bool = True) -> list[dict]:
    """Progressive rounds: each round regenerates trajectories with the previous round's model at its block size."""
    if not profile.rounds:
        raise ValueError(f"profile {profile.name!r} lists no rounds")
    reports, model_in, base_eval = [], None, None
    for i, spec in enumerate(profile.rounds):
        updates = {
            "trajectory": profile.trajectory.model_copy(
                update={"block_size": spec.block_size, "round_id": f"round-{i}"}
            )
        }
        training = {k: v for k, v in {"window": spec.window, "steps": spec.steps}.items() if v is not None}
        updates["training"] = profile.training.model_copy(update=training)
        round_profile = profile.model_copy(update=updates)
        report = run_round(
            round_profile,
            Path(out) / f"round-{i}-n{spec.block_size}",
            model_in=model_in,
            base_eval=base_eval,
            progress=progress,
        )
        reports.append(report)
        model_in = str(Path(out) / f"round-{i}-n{spec.block_size}" / "model")
        base_eval = report["base_eval"] if i == 0 else base_eval
    return reports
