"""A round's report as a type: report.json, the MLflow metrics, the Prefect artifacts, the registry's tags and the
CLI table all read these fields; what is derived (the headline's figures, plain Jacobi's TPF) is a property of the
two evaluations it holds, never a second copy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from jf_core.config import Profile
from jf_core.decoding import DecodeConfig
from jf_core.evaluation.gate import Figures
from jf_core.evaluation.method import AR, AR_CONTROL, Method, jacobi
from jf_core.evaluation.results import Evaluation, JsonModel, interval_metrics
from jf_core.evaluation.speed import MethodResult
from jf_core.round.paths import RoundPaths, eval_key
from jf_core.round.results import PackResult, Registration, TrainResult, TrajectoriesResult, TuneResult
from jf_core.threads import ThreadRecord


class Threads(BaseModel):
    """torch CPU threads each stage ran with, logged as the run's params."""

    model_config = ConfigDict(extra="forbid")

    train: ThreadRecord
    eval: int | None
    trajectory_actor: int  # the actors' Ray CPU allotment


class RoundSummary(BaseModel):
    """A round's headline as plain JSON: what `jf-round` returns (with its registration and MLflow run) and what
    `jf-progressive` passes on to the next round as history (the TPF-per-round plot)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    profile: str
    model_in: str
    model: str
    round_dir: str
    block_size: int
    accuracy: float
    base_accuracy: float
    tpf: dict[str, float]
    base_tpf: dict[str, float]
    headline_method: Method
    headline_tpf: float
    speedup_vs_ar: float
    identical_fraction: float
    decode_config: DecodeConfig
    # Against what a user gets without training, in the same run (evaluation.untrained): the headline's tokens/s over
    # the best untrained anchor's, which anchor that was, and the run's AR-against-AR control |x - 1|.
    speedup_vs_untrained: float | None = None
    best_untrained: str | None = None
    untrained_interval: tuple[float, float] | None = None  # its 95% over resampled prompts (speed.ratio_interval)
    timing_spread: float | None = None
    # The headline over the same decoding without the draft adapter (its corpus and config kept): the adapter's part.
    speedup_vs_no_adapter: float | None = None
    adapter_left_out: bool = False  # the model keeps a draft adapter its tuned config leaves out (Evaluation's)
    train_seconds: float
    # Wall seconds of each stage when it ran (RoundReport.stage_seconds): where a round's time went.
    stage_seconds: dict[str, float] = {}
    resumed_from_step: int | None = None
    dtype: str  # the evaluation's numerics (identity is promised in fp32, measured in bf16)
    metrics: list[dict[str, Any]]  # the table of TPF and TPS per block size (RoundReport.metrics_rows)
    registry: Registration | None = None
    mlflow_run_id: str | None = None
    mlflow_url: str | None = None


def stage_times(stage_seconds: dict[str, float]) -> str:
    """One line of where a round's time went: each stage's minutes, training's share of the stages' sum."""
    total = sum(stage_seconds.values())
    if not total:
        return "time per stage: not recorded"
    parts = [
        f"{name} {s / 60:.1f}" + (f" ({s / total:.0%})" if name == "train" else "") for name, s in stage_seconds.items()
    ]
    return f"minutes per stage: {', '.join(parts)}; {total / 60:.1f} in all"


def resumed_note(resumed_from_step: int | None) -> str:
    """Says so when training continued from a checkpoint a killed attempt left (else nothing)."""
    return f" (resumed from its checkpoint at step {resumed_from_step})" if resumed_from_step else ""


class RoundFigures(BaseModel):
    """What the gate reads of each model a round compares (jf_core/evaluation/gate.py): the trained model, its input
    and the chain's original base model, all on this round's evaluation."""

    model_config = ConfigDict(extra="forbid")

    candidate: Figures
    input: Figures
    lineage_base: Figures


class RoundReport(JsonModel):
    """The round's result. The headline is the trained model's evaluation's: the tuned decode config when there is
    one, else plain Jacobi at the block size chosen on calibration prompts; its speedup is against our AR on the same
    model. `base_eval` is the input model's evaluation; `lineage_base` the chain's original base model; `figures` what
    the gate reads of each (jf_core/evaluation/gate.py)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    profile: str
    model_in: str
    model: str
    round_dir: str
    block_size: int  # the trajectories' (training's) block size
    eval_key: str
    lineage_base: str
    lineage_base_accuracy: float
    figures: RoundFigures
    threads: Threads
    trajectories: TrajectoriesResult
    packing: PackResult
    training: dict[str, Any]  # the profile's training config
    train: TrainResult
    base_eval: Evaluation
    eval: Evaluation
    tune: TuneResult | None = None  # the trained model's decode config (None: the profile does not tune)
    tune_untrained: TuneResult | None = None  # the same tune on the input model: its untrained anchor's config

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Wall seconds of each stage when it ran, in the round's order (a stage reused from an earlier run counts
        that run's): what a user asks of a round's hours, and what says whether training had most of them."""
        stages = {
            "trajectories": self.trajectories.seconds,
            "pack": self.packing.seconds,
            "train": self.train.seconds or self.train.train_seconds,
            "tune": self.tune.seconds if self.tune is not None else None,
            "tune_untrained": self.tune_untrained.seconds if self.tune_untrained is not None else None,
            "evaluate_input": self.base_eval.eval_seconds or None,  # 0: read from the trained model's evaluation
            "evaluate": self.eval.eval_seconds,
        }
        return {name: s for name, s in stages.items() if s is not None}

    @property
    def method_name(self) -> str:
        """What trained the model: JF for Jacobi Forcing, CLLM for the baseline objective (the `tiny` profile's)."""
        return "CLLM" if self.training.get("method") == "cllm" else "JF"

    @property
    def accuracy(self) -> float:
        return self.eval.accuracy

    @property
    def base_accuracy(self) -> float:
        return self.base_eval.accuracy

    @property
    def tpf(self) -> dict[str, float]:
        return self.eval.tpf

    @property
    def base_tpf(self) -> dict[str, float]:
        return self.base_eval.tpf

    @property
    def headline(self) -> MethodResult:
        return self.eval.headline

    @property
    def tuned(self) -> MethodResult | None:
        return self.eval.tuned

    @property
    def identical_fraction(self) -> float:
        """The headline's identity with the model's greedy AR: 1.0 in fp32 by contract, measured in bf16."""
        return self.headline.identical_fraction

    def metrics_rows(self) -> list[dict]:
        """One row per evaluated block size: the input model against the trained one, named by the method that trained
        it (JF for Jacobi Forcing, CLLM for the baseline objective the `tiny` profile ships)."""
        trained, ar = self.method_name, self.eval.row(AR).tps
        rows = [
            {
                "block size n": int(n),
                "base TPF": round(self.base_tpf[n], 3),
                f"{trained} TPF": round(tpf, 3),
                f"{trained} TPS": round(self.eval.row(jacobi(int(n))).tps, 1),
                "AR TPS": round(ar, 1),
                "speedup vs AR": round(self.eval.row(jacobi(int(n))).tps / ar, 2),
            }
            for n, tpf in self.tpf.items()
        ]
        if (tuned := self.tuned) is not None:
            c = self.eval.decode_config  # tuned: a JFDecodeConfig
            rows.append(
                {
                    "block size n": f"tuned {c.describe()}",
                    "base TPF": "",
                    f"{trained} TPF": round(tuned.tpf, 3),
                    f"{trained} TPS": round(tuned.tps, 1),
                    "AR TPS": round(ar, 1),
                    "speedup vs AR": round(tuned.speedup_vs_ar, 2),
                }
            )
        # What the trained model is held to, from the same run: the input model's untrained decoding (in the base
        # columns) and our AR timed against itself (its ratio is the timing's spread).
        for r in self.eval.untrained_rows:
            rows.append(
                {
                    "block size n": f"untrained {r.name}",
                    "base TPF": round(r.tpf, 3),
                    f"{trained} TPF": "",
                    f"{trained} TPS": "",
                    "AR TPS": round(ar, 1),
                    "speedup vs AR": round(r.speedup_vs_ar, 2),
                }
            )
        if (control := self.eval.methods.get(AR_CONTROL.label)) is not None:
            rows.append(
                {
                    "block size n": "control: our AR again",
                    "base TPF": "",
                    f"{trained} TPF": round(control.tpf, 3),
                    f"{trained} TPS": round(control.tps, 1),
                    "AR TPS": round(ar, 1),
                    "speedup vs AR": round(control.speedup_vs_ar, 2),
                }
            )
        return rows

    def metrics(self) -> dict[str, float]:
        """The round's figures as flat MLflow metrics."""
        head, base = self.headline, self.base_eval.headline
        m = {
            "accuracy": self.accuracy,
            "base_accuracy": self.base_accuracy,
            "accuracy_drop": self.base_accuracy - self.accuracy,
            "tpf": head.tpf,
            "tps": head.tps,
            "tps_ar": self.eval.row(AR).tps,
            "speedup_vs_ar": head.speedup_vs_ar,  # the headline: against our own AR on the same model
            "speedup_vs_hf_generate": head.speedup_vs_hf_generate,
            "identical_fraction": self.identical_fraction,
            "train_seconds": self.train.train_seconds,
            **{f"stage_seconds_{name}": v for name, v in self.stage_seconds.items()},
            "lineage_base_accuracy": self.lineage_base_accuracy,
            **{f"output_{k}": v for k, v in head.output_stats.items()},  # what the gate's degeneracy checks read
            **{f"base_output_{k}": v for k, v in base.output_stats.items()},
        }
        if (tuned := self.tuned) is not None:
            m.update(tuned_tpf=tuned.tpf, tuned_tps=tuned.tps, tuned_speedup_vs_ar=tuned.speedup_vs_ar)
        if (best := (versus := self.eval.versus()).best) is not None:
            m.update(speedup_vs_untrained=versus.speedup, untrained_speedup_vs_ar=best.speedup_vs_ar)
            m.update(interval_metrics(versus.interval))
        if (spread := self.eval.timing_spread) is not None:
            m.update(timing_spread=spread)
        if (adapter := self.eval.speedup_vs_no_adapter) is not None:
            m.update(speedup_vs_no_adapter=adapter)
        m.update({f"tpf_n{n}": v for n, v in self.tpf.items()})
        m.update({f"base_tpf_n{n}": v for n, v in self.base_tpf.items()})
        m.update({f"tps_{name}": v for name, v in self.eval.tps.items()})
        return m

    def summary(self) -> RoundSummary:
        """The headline figures (`RoundSummary`), before registration."""
        versus = self.eval.versus()
        return RoundSummary(
            profile=self.profile,
            model_in=self.model_in,
            model=self.model,
            round_dir=self.round_dir,
            block_size=self.block_size,
            accuracy=self.accuracy,
            base_accuracy=self.base_accuracy,
            tpf=self.tpf,
            base_tpf=self.base_tpf,
            headline_method=self.eval.headline_method,
            headline_tpf=self.headline.tpf,
            speedup_vs_ar=self.headline.speedup_vs_ar,
            identical_fraction=self.identical_fraction,
            decode_config=self.eval.decode_config,
            speedup_vs_untrained=versus.speedup,
            best_untrained=versus.best and versus.best.name,
            untrained_interval=versus.interval,
            timing_spread=self.eval.timing_spread,
            speedup_vs_no_adapter=self.eval.speedup_vs_no_adapter,
            adapter_left_out=self.eval.adapter_left_out,
            train_seconds=self.train.train_seconds,
            stage_seconds=self.stage_seconds,
            resumed_from_step=self.train.resumed_from_step,
            dtype=self.eval.dtype,
            metrics=self.metrics_rows(),
        )


def round_report(
    profile: Profile,
    model_in: str,
    paths: RoundPaths,
    trajectories: TrajectoriesResult,
    packing: PackResult,
    train: TrainResult,
    base: Evaluation,
    jf: Evaluation,
    lineage_base: tuple[str, Evaluation] | None = None,
    *,
    tune: TuneResult | None = None,
    tune_untrained: TuneResult | None = None,
) -> RoundReport:
    """The report of a round from its stages' results; `lineage_base` is the chain's original base model and its
    evaluation (None: the input is the base); `tune`, `tune_untrained`: the tune stages' results, where they ran."""
    key = eval_key(profile)
    origin, origin_eval = lineage_base or (model_in, base)
    return RoundReport(
        profile=profile.name,
        model_in=model_in,
        model=str(paths.model),
        round_dir=str(paths.root),
        block_size=profile.trajectory.block_size,
        eval_key=key,
        lineage_base=origin,
        lineage_base_accuracy=origin_eval.accuracy,
        figures=RoundFigures(
            candidate=Figures.of(jf, key), input=Figures.of(base, key), lineage_base=Figures.of(origin_eval, key)
        ),
        threads=Threads(
            train=train.threads, eval=jf.torch_threads, trajectory_actor=max(1, int(profile.compute.cpus_per_worker))
        ),
        trajectories=trajectories,
        packing=packing,
        training=profile.training.model_dump(),
        train=train,
        base_eval=base,
        eval=jf,
        tune=tune,
        tune_untrained=tune_untrained,
    )
