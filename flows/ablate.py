"""Flow `jf-ablate`: variants of a profile at equal compute, several seeds each, under one MLflow parent run.

    jf ablate --profile tiny                      # the catalog (jf_core/experiments/ablation.py), seeds 0 1 2
    jf ablate --variant "jf random w16" --variant cllm --seeds 0,1,2 --set training.steps=600

Every (variant, seed) is a round's stages without the tuner and the registry: trajectories (shared by every
variant with the same trajectory config), pack, train and evaluate, each cached by its inputs like a round's, so an
interrupted ablation resumes where it stopped. Each gets a child MLflow run (its overrides as params, accuracy, TPF
per block size and the noise its schedule picked as metrics); the parent gets the table (mean ± sd over seeds, the
paper's figures beside), the runs as JSON and a comparison plot, and Prefect gets the table as an artifact.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from jacobi_forcing.flows.round import load
from jacobi_forcing.tasks import mlflow_runs, round_tasks
from jacobi_forcing.tasks.reporting import artifact_key
from jf_core.config import Profile, ProfileOverrides, overrides_dict
from jf_core.evaluation.method import TUNED
from jf_core.experiments import ablation, variants
from jf_core.experiments.run import VariantRun, run_variants

# What an ablation measures by default: accuracy and TPF at two block sizes. The tuner and the speed benchmark
# (wall-clock TPS) answer other questions and would cost most of each run's time; overrides may turn them back on.
EVALUATION = {"evaluation": {"tune": {"enabled": False}, "block_sizes": [16, 32], "speed_prompts": 1, "repeats": 1}}


def _row(
    run: VariantRun, variant: str, seed: int, decode, client, experiment: str, parent: str
) -> ablation.AblationRun:
    """One (variant, seed) trained by `run_variants`: measured as a round measures a model (the profile's benchmark
    through `round_tasks.evaluate`), then its child MLflow run; returns its row for `ablation.summarize`. `decode`:
    the multi-block config the model is also measured with (stored as its decode config, as the round's tuner stores
    its choice)."""
    from jf_core.model_dir import save_decode_config, saved_decode_config

    prof, packed, trained = run.profile, run.packed, run.trained
    model = str(run.paths.model)
    if saved_decode_config(model) != asdict(decode):
        save_decode_config(model, decode)
    result = round_tasks.evaluate(prof, model, f"{variant}, seed {seed}")
    row = ablation.AblationRun(
        variant=variant,
        seed=seed,
        accuracy=result.accuracy,
        tpf=result.tpf,
        multiblock_tpf=result.row(TUNED).tpf,
        noise=packed.noise,
        train_seconds=trained.train_seconds,
        round_dir=str(run.paths.root),
    )
    tags = {"jf.variant": variant, "jf.seed": str(seed), "prefect.flow_run_id": str(flow_run.id or "")}
    name = f"{variant} (seed {seed})"
    with mlflow_runs.mlflow_run(client, experiment, name, profile=prof, parent=parent, tags=tags) as run_id:
        mlflow_runs.log_params(client, run_id, prof)
        metrics = {
            "accuracy": result.accuracy,
            "train_seconds": trained.train_seconds,
            "picked_noise_mean": packed.noise.picked_mean,
            "picked_noise_above_half": packed.noise.picked_above_half,
            "blocks_per_answer": packed.noise.blocks_per_answer.mean,
            **{f"tpf_n{n}": v for n, v in result.tpf.items()},
            "tpf_multiblock": result.row(TUNED).tpf,
        }
        for key, value in metrics.items():
            client.log_metric(run_id, key, float(value))
        client.log_dict(run_id, row.model_dump(mode="json"), "ablation/run.json")
    return row


def _equal_compute(runs: dict[tuple[str, int], Profile]) -> None:
    """Every run trains the same steps on the same batches of the same prompts from the same model: a variant that
    changes any of these is not an ablation at equal compute, and is refused naming the field."""

    def budget(prof: Profile) -> dict:
        t = prof.training
        return {
            "training.steps": t.steps,
            "training.batch_size": t.batch_size,
            "training.grad_accum": t.grad_accum,
            "prompts": prof.prompts.model_dump(),
            "model.path": prof.model.path,
        }

    (first_name, _), first = next(iter(runs.items()))
    reference = budget(first)
    for (name, _), prof in runs.items():
        for field, value in budget(prof).items():
            if value != reference[field]:
                raise ValueError(
                    f"ablation variant {name!r} changes {field} ({value!r}, {first_name!r} has {reference[field]!r}): "
                    "variants must run at equal compute; set it in the common overrides instead"
                )


@flow(name="jf-ablate", flow_run_name="jf-ablate-{profile}", log_prints=True, validate_parameters=True)
def jf_ablate(
    profile: str = "tiny",
    ablation_config: ablation.AblationConfig | None = None,
    overrides: ProfileOverrides | None = None,
    model: str | None = None,
) -> ablation.AblationResult:
    """`overrides` apply to every variant (the equal compute: steps, prompts, evaluation), before the variant's
    own; `model`: the starting model (default: the profile's)."""
    started = time.monotonic()
    spec = ablation_config or ablation.AblationConfig()
    logger = get_run_logger()
    common = variants.merge(EVALUATION, overrides_dict(overrides))
    base = load(profile, common)
    # Every run's profile first: a bad variant is refused, naming it, before any work.
    runs: dict[tuple[str, int], Profile] = {}
    for name, variant in spec.catalog().items():
        for seed in spec.seeds:
            try:
                runs[(name, seed)] = load(profile, variants.run_overrides(common, variant, seed))
            except ValueError as err:
                raise ValueError(f"ablation variant {name!r}: {err}") from None
    _equal_compute(runs)
    decode = spec.multiblock_config(base.evaluation.max_new_tokens)
    client, experiment = mlflow_runs.connect(base)
    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "jf.profile": base.name, "jf.kind": "ablation"}
    with mlflow_runs.mlflow_run(
        client, experiment, f"jf-ablate {base.name}", profile=base, tags=tags, logger=logger
    ) as parent:
        mlflow_runs.log_params(client, parent, base)
        client.log_dict(parent, spec.model_dump(mode="json"), "ablation/config.json")
        model_in = round_tasks.resolve_model(model or base.model.path, base)
        input_eval = round_tasks.evaluate(base, model_in, "input model")
        # The one runner of variants (jf_core/experiments/run.py), its stages as this flow's Prefect tasks and its
        # measure the round's evaluation on the profile's benchmark.
        named = {f"{name} (seed {seed})": (name, seed) for name, seed in runs}
        catalog = spec.catalog()
        overrides = {label: variants.run_overrides(common, catalog[n], s) for label, (n, s) in named.items()}
        validated = {label: runs[key] for label, key in named.items()}  # the profiles checked above, not loaded again

        def measure(run: VariantRun) -> ablation.AblationRun:
            name, seed = named[run.name]
            return _row(run, name, seed, decode, client, experiment, parent)

        def say(row: ablation.AblationRun) -> None:
            logger.info("run %d/%d done: %s, seed %d", len(done) + 1, len(runs), row.variant, row.seed)
            done.append(row)

        done: list[ablation.AblationRun] = []
        rows = run_variants(
            lambda label, _o: validated[label],
            model_in,
            overrides,
            train=round_tasks.train_chain,
            measure=measure,
            on_row=say,
        )
        summary = ablation.summarize(rows)
        input_model = ablation.InputFigures(accuracy=input_eval.accuracy, tpf=input_eval.tpf)
        table = ablation.markdown(summary, base=input_model, multiblock=spec.multiblock.describe())
        seconds = time.monotonic() - started
        client.log_text(parent, table, "ablation/table.md")
        logged = {"summary": summary, "runs": rows, "seconds": seconds}
        client.log_dict(
            parent, json.loads(json.dumps(logged, default=lambda m: m.model_dump(mode="json"))), "ablation/results.json"
        )
        import matplotlib.pyplot as plt

        figure = ablation.figure(summary)
        client.log_figure(parent, figure, "plots/ablation.png")
        plt.close(figure)
        client.log_metric(parent, "seconds", seconds)
    answers = rows[0].noise.blocks_per_answer
    note = (
        f"\n{len(runs)} runs ({len(spec.catalog())} variants x {len(spec.seeds)} seeds) of "
        f"{next(iter(runs.values())).training.steps} training steps in {seconds / 60:.1f} min; "
        f"answers hold {answers.mean:.1f} blocks "
        f"(p10 {answers.p10}, p50 {answers.p50}, p90 {answers.p90}) at n={base.trajectory.block_size}.\n"
    )
    create_markdown_artifact(
        f"# Ablation of `{base.name}`\n\n{table}{note}",
        key=artifact_key("jf-ablate", base.name),
        description="ablation at equal compute",
    )
    logger.info("ablation table:\n%s%s", table, note)
    return ablation.AblationResult(
        summary=summary,
        runs=rows,
        table=table,
        note=note,
        input_model=input_model,
        seconds=seconds,
        mlflow_run_id=parent,
        config=spec,
    )
