"""A round's report: one dict with the same names in report.json, MLflow, the Prefect artifacts and the CLI table."""

from __future__ import annotations

from dataclasses import asdict

from jf_core.config import Profile
from jf_core.round.paths import RoundPaths, eval_key


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
