"""An evaluation's result as a type: what `evaluate_model` returns, the round caches as JSON, the gate reads, the CLI
prints and MLflow logs, all from these fields. Each method's row is a `speed.MethodResult`; what a reader wants of
the whole (plain Jacobi's TPF per block size, the headline's figures) is derived from the rows, never stored twice."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from jf_core.decoding import DecodeConfig, JacobiConfig
from jf_core.evaluation.method import ANCHOR_KINDS, AR, AR_CONTROL, NO_ADAPTER, TUNED, UNTRAINED, Method, jacobi
from jf_core.evaluation.speed import MethodResult, ratio_interval


@dataclass(frozen=True)
class Versus:
    """A row's tokens/s over the fastest of some others' (`Evaluation.versus`); None, None: none of them ran."""

    best: MethodResult | None
    speedup: float | None
    subject: MethodResult | None = None  # the row held to `best`

    @property
    def interval(self) -> tuple[float, float] | None:
        """The speedup's 95% paired bootstrap over the prompts' batches (speed.py `ratio_interval`), made only where
        it is read; None: not known."""
        if self.best is None or self.subject is None:
            return None
        return ratio_interval(self.subject, self.best)

    def line(self, spread: float | None) -> str:
        """What every report prints beside the headline (`against_untrained`)."""
        return against_untrained(self.speedup, self.best and self.best.name, spread, self.interval)


class JsonModel(BaseModel):
    """A result kept as one JSON file: written atomically, read back as the type (a file of another shape is a
    ValidationError naming the field)."""

    def save(self, path: Path) -> None:
        from jf_core.atomic import write_json_atomic

        write_json_atomic(path, self.model_dump(mode="json"))

    @classmethod
    def load(cls, path: Path):
        return cls.model_validate_json(Path(path).read_text())


class Calibration(BaseModel):
    """Plain Jacobi's block size chosen by TPS on calibration prompts (none when the evaluation has one size)."""

    model_config = ConfigDict(extra="forbid")

    prompts: int = 0
    tps: dict[str, float] = {}


class Evaluation(JsonModel):
    """One model's evaluation (jf_core/evaluation/evaluate.py): every method's row on the same prompts, the block size
    chosen on calibration prompts and the headline method (the tuned decode config, else plain Jacobi at that n)."""

    # NaN (a speedup against a method that did not run) is written as JSON's NaN, like `json.dumps` does, so the
    # cached file reads back as the same floats.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    benchmark: str
    items: int
    dtype: str
    block_sizes: list[int]  # plain Jacobi's, each a `jacobi(n)` row
    methods: dict[str, MethodResult]  # by `Method.label`: JSON keys; ask by the method with `row`
    calibration: Calibration
    speedup_block_size: int
    headline_method: Method
    decode_config: DecodeConfig  # the headline's (a JFDecodeConfig when the model was tuned)
    eval_seconds: float
    model: str | None = None  # what was evaluated, when the caller knows (the round's stage does)
    draft_adapter: bool = False  # the evaluated model keeps a draft adapter (draft_adapter.safetensors)
    torch_threads: int | None = None  # the one thread count every method ran with

    def row(self, method: Method) -> MethodResult:
        return self.methods[method.label]

    @property
    def accuracy(self) -> float:
        """Greedy accuracy: the model's own, whatever decodes it (our AR's texts, scored)."""
        return float(self.row(AR).accuracy)

    @property
    def headline(self) -> MethodResult:
        return self.row(self.headline_method)

    @property
    def tpf(self) -> dict[str, float]:
        """Plain Jacobi's TPF per block size (keys are strings: they are JSON keys and MLflow names too)."""
        return {str(n): self.row(jacobi(n)).tpf for n in self.block_sizes}

    @property
    def tps(self) -> dict[str, float]:
        return {name: r.tps for name, r in self.methods.items()}

    @property
    def accepted_histogram(self) -> dict[str, dict[int, int]]:
        return {str(n): self.row(jacobi(n)).accepted_histogram for n in self.block_sizes}

    @property
    def tuned(self) -> MethodResult | None:
        return self.methods.get(TUNED.label)

    @property
    def timing_spread(self) -> float | None:
        """How far two timings of the same work land apart in this run (the order's bias, the machine's noise, a
        second model's weights in the caches): the largest |x - 1| of its AR-against-AR pairs, our AR against every
        row whose every prompt our AR decoded: its control row, every other model's AR row (the untrained anchors'
        input model, a bench's trained model: trained from the same architecture, the same work a token), and any
        decoder whose dispatch sent every batch to AR (`ar_share` 1). At batch 16 on the embedded model such a
        dispatched row read 0.83x where the control read 0.99x (docs/decoding.md, "Timed for seconds"): the control
        alone understated the spread. None without the control row."""
        if AR_CONTROL.label not in self.methods:
            return None
        # The kinds as well as the share: an evaluation cached before rows recorded their AR share reads 0.0 there.
        pairs = [r for r in self.methods.values() if r.method.kind in ("ar", "ar_control") or r.ar_share == 1.0]
        return max(abs(r.speedup_vs_ar - 1.0) for r in pairs)

    @property
    def untrained_rows(self) -> list[MethodResult]:
        """The untrained anchors (`evaluation.untrained`): the input model decoded by HF prompt lookup and by our
        decoder's config tuned on it, timed in this run beside the trained model's rows."""
        return [r for r in self.methods.values() if r.method.model == UNTRAINED and r.method.kind in ANCHOR_KINDS]

    def versus(self, subject: Method | None = None, anchors: list[Method] | None = None) -> Versus:
        """One row (default: the headline) against the fastest of `anchors`' rows that ran (default: the untrained
        anchors), both timed in this run: what every report says of a trained model against decoding untrained."""
        labels = {m.label for m in anchors} if anchors is not None else None
        rows = self.untrained_rows if labels is None else [r for k, r in self.methods.items() if k in labels]
        best = max(rows, key=lambda r: r.tps, default=None)
        row = self.headline if subject is None else self.row(subject)
        if best is None:
            return Versus(None, None)
        return Versus(best, row.tps / best.tps, row)

    @property
    def best_untrained(self) -> MethodResult | None:
        return self.versus().best

    @property
    def speedup_vs_untrained(self) -> float | None:
        """The headline's tokens/s over the best untrained anchor's (None: no anchor ran)."""
        return self.versus().speedup

    @property
    def speedup_vs_no_adapter(self) -> float | None:
        """The headline's tokens/s over the same decoding without the draft adapter (the `no_adapter_tuned` row: the
        input model with the trained model's corpus and config): what the adapter adds. None where it did not run."""
        return self.versus(anchors=[TUNED.of(NO_ADAPTER)]).speedup

    @property
    def adapter_left_out(self) -> bool:
        """The model keeps a draft adapter and its tuned config decodes without it (the grid's adapter-off configs
        decoded faster here), so the headline's speed owes nothing to the adapter's training."""
        return self.draft_adapter and self.headline_method == TUNED and not self.decode_config.adapter

    def input_evaluation(self) -> Evaluation | None:
        """The input model's own evaluation, read from this one's untrained rows where they make it
        (`EvalConfig.reads_input_model`): its AR and plain Jacobi rows, scored on these prompts in this run's one
        pass, its speedups against its own AR, the headline plain Jacobi at the one block size, as `evaluate_model`
        makes it for a model without a tuned config. A round then decodes the input model once, not in a pass of its
        own (5 of the smollm2-135m round's 64 minutes, 2026-12-05). None where the rows are not all here and
        scored: the input model needs that pass."""
        if len(self.block_sizes) != 1:
            return None
        own = [AR, *(jacobi(n) for n in self.block_sizes)]
        found = [self.methods.get(m.of(UNTRAINED).label) for m in own]
        if any(r is None or r.accuracy is None for r in found):
            return None
        ar = found[0].tps
        rows = {m.label: replace(r, method=m, speedup_vs_ar=r.tps / ar) for m, r in zip(own, found, strict=True)}
        n = self.block_sizes[0]
        return Evaluation(
            benchmark=self.benchmark,
            items=self.items,
            dtype=self.dtype,
            block_sizes=[n],
            methods=rows,
            calibration=Calibration(),
            speedup_block_size=n,
            headline_method=jacobi(n),
            decode_config=JacobiConfig(block_size=n, max_new_tokens=self.decode_config.max_new_tokens),
            eval_seconds=0.0,  # its rows' time is this evaluation's
            torch_threads=self.torch_threads,
        )

    def metrics(self) -> dict[str, float]:
        """The headline, plain Jacobi's TPF per block size and every method's TPS, as flat MLflow metrics."""
        spread, versus, adapter = self.timing_spread, self.versus(), self.speedup_vs_no_adapter
        return {
            "accuracy": self.accuracy,
            "headline_tpf": self.headline.tpf,
            "speedup_vs_ar": self.headline.speedup_vs_ar,  # against our own AR on the same model
            **({} if spread is None else {"timing_spread": spread}),
            **({} if versus.speedup is None else {"speedup_vs_untrained": versus.speedup}),
            **interval_metrics(versus.interval),
            **({} if adapter is None else {"speedup_vs_no_adapter": adapter}),
            **({"adapter_in_headline": float(not self.adapter_left_out)} if self.draft_adapter else {}),
            **{f"tpf_n{n}": v for n, v in self.tpf.items()},
            **{f"tps_{name}": v for name, v in self.tps.items()},
        }

    def rows(self) -> list[MethodResult]:
        """Every method's row, for `tables.format_table` and the plots."""
        return list(self.methods.values())


def against_untrained(
    speedup: float | None, best: str | None, spread: float | None, interval: tuple[float, float] | None = None
) -> str:
    """The line every report prints beside the headline: the trained model against the best untrained decoding of
    its input model, measured in the same run, how far it could land on other such prompts (`interval`), and the
    run's AR-against-AR spread."""
    control = "" if spread is None else f"; timing spread (AR against AR in this run) {spread:.3f}"
    if speedup is None:
        return f"no untrained anchor in this run{control}"
    over = "" if interval is None else f"; {interval[0]:.2f}-{interval[1]:.2f} over resampled prompts (95%)"
    return f"{speedup:.2f}x the best untrained decoding of the input model ({best}{over}){control}"


def interval_metrics(interval: tuple[float, float] | None) -> dict[str, float]:
    """The speedup over the best untrained decoding's 95% bounds as MLflow metrics (none where not known)."""
    if interval is None:
        return {}
    return {"speedup_vs_untrained_low": interval[0], "speedup_vs_untrained_high": interval[1]}


def adapter_part(speedup: float | None, left_out: bool = False) -> str:
    """The report's line on the draft adapter (a line with its newline; empty where the model has none): the
    trained model against its own decoding without the adapter, or that the tune left the adapter out, so a corpus's
    gain is not read as training's."""
    if speedup is not None:
        return (
            f"{speedup:.2f}x the same decoding without its draft adapter (corpus and config kept: no_adapter_tuned)\n"
        )
    if left_out:
        return (
            "the tuned config leaves the draft adapter out (on this grid and machine decoding without it was faster): "
            "this speed is the draft corpus's and the decode config's, none of it the adapter's training\n"
        )
    return ""
