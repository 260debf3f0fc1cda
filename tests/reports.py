"""Typed results with chosen figures, for tests of what reads them (the table, the summary, the registry): an
`Evaluation` built from method rows, and a `RoundReport` around two of them."""

from __future__ import annotations

from jf_core.evaluation.gate import Figures
from jf_core.evaluation.method import AR, AR_CONTROL, TUNED, UNTRAINED, Method, jacobi
from jf_core.evaluation.results import Calibration, Evaluation
from jf_core.evaluation.speed import MethodResult
from jf_core.round.report import RoundReport, Threads
from jf_core.round.results import PackResult, TrainResult, TrajectoriesResult
from jf_core.training.noise import BlocksPerAnswer, NoiseProfile

TRAJECTORIES = TrajectoriesResult(
    out="/runs/tiny/trajectories/n16-abc",
    prompts=8,
    skipped={},
    shards=1,
    shards_generated=1,
    rows=40,
    new_tokens_generated=320,
    seconds=4.0,
    pool_seconds=2.0,
)
PACKING = PackResult(
    examples=8,
    blocks=40,
    dropped_blocks={},
    noise=NoiseProfile(
        blocks_per_answer=BlocksPerAnswer(mean=5.0, p10=4, p50=5, p90=6),
        target_mean=0.5,
        picked_mean=0.5,
        picked_above_half=0.4,
        picked_histogram=[4] * 10,
    ),
)


def evaluation(
    tpf: dict[int, float],
    tps: dict[str, float],
    *,
    accuracy: float = 1.0,
    tuned: dict | None = None,
    speedup_block_size: int | None = None,
    output: dict[str, float] | None = None,
    untrained: dict[str, tuple[float, float]] | None = None,
    control_tps: float | None = None,
) -> Evaluation:
    """Plain Jacobi's rows at `tpf`'s block sizes, our AR's, and a `tuned` row ({tpf, tps, config}) when given;
    `untrained`: anchor rows by kind ({"tuned": (tpf, tps)}: `base_tuned`); `control_tps`: the AR-against-AR row.
    Every speedup is against the AR row's TPS, as `speed.bench` computes it."""
    ar = tps["ar"]

    def row(method: Method, tpf: float, tps: float) -> MethodResult:
        return MethodResult(
            method, tpf, tps, None, None, 1.0, 100, speedup_vs_ar=tps / ar, identical_fraction=1.0,
            accuracy=accuracy, accepted_histogram={1: 3, 2: 1}, output_stats=dict(output or {"repetition": 0.0}),
        )  # fmt: skip

    rows = [row(AR, 1.0, ar)] + [row(jacobi(n), v, tps[jacobi(n).label]) for n, v in tpf.items()]
    best = speedup_block_size or max(tpf)
    config = {"block_size": best, "max_new_tokens": 100}
    if tuned is not None:
        rows.append(row(TUNED, tuned["tpf"], tuned["tps"]))
        config = tuned["config"]
    rows += [row(Method(kind, model=UNTRAINED), *figures) for kind, figures in (untrained or {}).items()]
    if control_tps is not None:
        rows.append(row(AR_CONTROL, 1.0, control_tps))
    return Evaluation(
        benchmark="embedded",
        items=8,
        dtype="float32",
        block_sizes=sorted(tpf),
        methods={r.name: r for r in rows},
        calibration=Calibration(prompts=2, tps={str(n): tps[jacobi(n).label] for n in tpf}),
        speedup_block_size=best,
        headline_method=TUNED if tuned is not None else jacobi(best),
        decode_config=config,
        eval_seconds=1.0,
    )


def round_report(
    jf: Evaluation,
    base: Evaluation,
    *,
    figures: dict[str, Figures] | None = None,  # by role: candidate, input, lineage_base
    method: str = "jacobi_forcing",
    **fields,
) -> RoundReport:
    """A report of a round that trained `base`'s model into `jf`'s; `figures` default to the two evaluations'."""
    key = fields.pop("eval_key", "same-evaluation")
    values = {
        "profile": "tiny",
        "model_in": "/m/in",
        "model": "/m/out",
        "round_dir": "/runs/tiny/n16-abc",
        "block_size": 16,
        "eval_key": key,
        "lineage_base": "/m/in",
        "lineage_base_accuracy": base.accuracy,
        "figures": figures
        or {"candidate": Figures.of(jf, key), "input": Figures.of(base, key), "lineage_base": Figures.of(base, key)},
        "threads": Threads(train={"policy": "fixed", "initial": 1}, eval=1, trajectory_actor=1),
        "trajectories": TRAJECTORIES,
        "packing": PACKING,
        "training": {"method": method},
        "train": TrainResult(
            steps=20,
            train_seconds=464.0,
            model_in="/m/in",
            strategy="single",
            workers=1,
            compute_dtype="bfloat16",
            history=[{"step": 0, "loss": 2.0}, {"step": 10, "loss": 1.0}],
        ),
        "base_eval": base,
        "eval": jf,
    }
    return RoundReport(**(values | fields))
