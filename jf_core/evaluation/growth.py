"""How TPF grows with training tokens: a run's probes (`probe_curves`), least-squares fits of them and the tokens at
which a fit reaches a target TPF, with an interval; `curve_fits` and `fits_table` for an experiment's rows
(jf_core/experiments/'s summaries, or JSON lines a GPU run wrote).

Two forms, since a curve that bends can sit between them: `log10` (TPF = a + b log10 tokens) and `linear` (TPF =
a + b tokens / 10^6). Each fit keeps its coefficients' covariance (ordinary least squares, the residual variance
over n - 2), and `tokens_for` draws coefficients from it to give the crossing's interval: an extrapolation beyond
the probes is only as good as the form, which is why both are reported side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jf_core.training.history import TpfProbe, tpf_probes

FORMS = ("log10", "linear")
# The TPF the project's goals name: 1.5 (the peers' draft-only figure), 2.0 and 2.5 (the scale issue's budgets).
TARGETS = (1.5, 2.0, 2.5)


@dataclass(frozen=True)
class GrowthFit:
    form: str
    a: float
    b: float  # TPF per decade of tokens (log10) or per 10^6 tokens (linear)
    cov: tuple[tuple[float, float], tuple[float, float]]  # of (a, b)
    r2: float
    points: int

    @property
    def b_se(self) -> float:
        return math.sqrt(self.cov[1][1])

    def at(self, tokens: float) -> float:
        return self.a + self.b * _x(self.form, np.asarray(tokens, dtype=float)).item()

    def tokens_for(self, tpf: float, level: float = 0.90, samples: int = 100_000, seed: int = 0):
        """(estimate, low, high) packed tokens at which the fit reaches `tpf`; None where it never does (a flat or
        falling fit). The interval: the crossing under coefficients drawn from the fit's covariance (a multivariate
        t), the draws whose slope is not positive left out (they never cross)."""
        if self.b <= 0:
            return None
        estimate = _tokens(self.form, (tpf - self.a) / self.b)
        rng = np.random.default_rng(seed)
        # Student's t with n - 2 degrees of freedom (the variance is estimated from few points), not the normal.
        df = self.points - 2
        spread = (
            rng.multivariate_normal([0.0, 0.0], self.cov, size=samples)
            * np.sqrt(df / rng.chisquare(df, samples))[:, None]
        )
        draws = np.array([self.a, self.b]) + spread
        draws = draws[draws[:, 1] > 0]
        with np.errstate(over="ignore"):
            # A linear draw can cross before 0 tokens (its intercept above the target): no run is shorter than 0.
            crossings = np.maximum(_tokens(self.form, (tpf - draws[:, 0]) / draws[:, 1]), 0.0)
        low, high = np.quantile(crossings, [(1 - level) / 2, (1 + level) / 2])
        return float(estimate), float(low), float(high)


def probe_curves(run: dict) -> dict[TpfProbe, list[tuple[int, float, float]]]:
    """An experiment row's probes (`ExperimentRow.summary()`: `train_tokens`, `history` with the training probe's
    figures) as {probe: [(step, packed tokens by then, TPF)]}: the run's tokens per step times the steps done."""
    history = run.get("history") or []
    steps = max((row["step"] for row in history), default=-1) + 1
    per_step = run["train_tokens"] / steps if steps else 0.0
    return {p: [(step, (step + 1) * per_step, tpf) for step, tpf in p.points(history)] for p in tpf_probes(history)}


@dataclass(frozen=True)
class CurveFit:
    """One probed curve of one run fitted in one form: for each target TPF the tokens the fit reaches it at with a
    90% interval (`budgets`; None: never), beside the tokens of the first probe that measured it (`measured`)."""

    variant: str
    probe: TpfProbe
    fit: GrowthFit
    budgets: dict[float, tuple[float, float, float] | None]
    measured: dict[float, float | None]

    def metrics(self) -> dict[str, float]:
        """Its figures as flat metric names (MLflow's), e.g. `fit.log10.n16.tokens_tpf_2.0`."""
        name = f"fit.{self.fit.form}.{self.probe.label}"
        out = {f"{name}.r2": self.fit.r2, f"{name}.slope": self.fit.b}
        out.update({f"{name}.tokens_tpf_{t}": v[0] for t, v in self.budgets.items() if v is not None})
        return out


def curve_fits(rows: Sequence[dict], targets: Sequence[float] = TARGETS) -> list[CurveFit]:
    """Each probed curve of each row fitted in both forms. A curve probed fewer than 3 times is not fitted."""
    out = []
    for row in rows:
        for probe, points in probe_curves(row).items():
            if len(points) < 3:
                continue
            tokens, tpf = [t for _, t, _ in points], [v for _, _, v in points]
            for form in FORMS:
                fit = fit_growth(tokens, tpf, form)
                reached = {t: next((x for x, v in zip(tokens, tpf, strict=True) if v >= t), None) for t in targets}
                budgets = {t: fit.tokens_for(t) for t in targets}
                out.append(CurveFit(row["variant"], probe, fit, budgets, reached))
    return out


def fits_table(fits: Sequence[CurveFit]) -> str:
    """`curve_fits`' entries as a Markdown table: the budget for each target with its interval."""
    from jf_core.evaluation.tables import markdown

    def crossing(value) -> str:
        return "never (slope <= 0)" if value is None else f"{value[0]:.2g} ({value[1]:.2g}-{value[2]:.2g})"

    targets = list(fits[0].budgets) if fits else []
    head = ["variant", "probe", "form", "R^2", "slope (+- SE)"]
    head += [f"tokens to TPF {t} (90%)" for t in targets] + [f"measured TPF {t} at" for t in targets]
    cells = [
        [f.variant, f.probe.label, f.fit.form, f"{f.fit.r2:.3f}",
         f"{f.fit.b:.3f} +- {f.fit.b_se:.3f} a {'decade' if f.fit.form == 'log10' else '1e6 tokens'}"]
        + [crossing(f.budgets[t]) for t in targets]
        + ["-" if f.measured[t] is None else f"{f.measured[t]:.2g}" for t in targets]
        for f in fits
    ]  # fmt: skip
    return markdown(head, cells)


def fit_growth(tokens: Sequence[float], tpf: Sequence[float], form: str) -> GrowthFit:
    """Ordinary least squares of TPF on the form's x; at least 3 points (two would leave no residual)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    if len(tokens) != len(tpf) or len(tokens) < 3:
        raise ValueError(f"a growth fit needs 3 or more (tokens, TPF) points, got {len(tokens)} and {len(tpf)}")
    x = _x(form, np.asarray(tokens, dtype=float))
    y = np.asarray(tpf, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - (a + b * x)
    variance = float(residual @ residual) / (len(y) - 2)
    cov = variance * np.linalg.inv(design.T @ design)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(residual @ residual) / total if total > 0 else 1.0
    return GrowthFit(form, float(a), float(b), ((cov[0, 0], cov[0, 1]), (cov[1, 0], cov[1, 1])), r2, len(y))


def _x(form: str, tokens: np.ndarray) -> np.ndarray:
    return np.log10(tokens) if form == "log10" else tokens / 1e6


def _tokens(form: str, x):
    return 10.0**x if form == "log10" else x * 1e6
