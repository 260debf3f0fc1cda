"""How TPF grows with training tokens: least-squares fits of a run's probes (`plots.probe_curves`) and the tokens at
which a fit reaches a target TPF, with an interval.

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

FORMS = ("log10", "linear")


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
