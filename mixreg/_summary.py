"""The table of estimates a statistician reports: estimate, std. error, z, p and interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._inference import normal_quantile, two_sided_p_value

FloatArray = NDArray[np.float64]

INTERCEPT_NAME = "(Intercept)"
WEIGHT_NAME = "weight"
NOISE_VARIANCE_NAME = "noise_variance"


@dataclass(frozen=True)
class SummaryRow:
    """One parameter of one line: its estimate, standard error, Wald z and p, and interval.

    ``z_value`` and ``p_value`` test the parameter against 0; they are None for the weight and
    the noise variance (0 is on the edge of their range, where a Wald test means nothing).
    Every number is None where the standard error does not exist (a singular information).
    """

    component: int
    parameter: str
    estimate: float
    std_error: float | None
    z_value: float | None
    p_value: float | None
    lower: float | None
    upper: float | None


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class InferenceSummary:
    """Per line, the table of R's ``summary(refit(m))`` plus the weight and noise variance.

    Attributes
    ----------
    rows : list of SummaryRow
        Line 0's coefficients (features, then the intercept), weight and noise variance, then
        line 1's, and so on.
    level : float
        The confidence level of ``lower`` and ``upper``.
    log_likelihood : float
        Of the maximum-likelihood fit the estimates are.
    start : str or None
        Where EM started that reached the maximum the estimates are (printed).
    gate_rows : list of SummaryRow
        A gated fit's gate (as R's concomitant model): for every component but the first
        (the reference), the intercept then the slope on each concomitant column of its
        multinomial logit; empty without a gate.
    """

    rows: list[SummaryRow]
    level: float
    log_likelihood: float
    gate_rows: list[SummaryRow] = field(default_factory=list)
    start: str | None = None
    """Where EM started that reached the maximum (``"min-loss lines"`` or ``"em restart"``);
    None for a gated fit (gated EM's start is ``gate_start_``)."""

    def to_records(self) -> list[dict[str, Any]]:
        """The rows as JSON-ready dicts (None where a number does not exist)."""
        return [asdict(row) for row in self.rows]

    def gate_records(self) -> list[dict[str, Any]]:
        """The gate's rows as JSON-ready dicts."""
        return [asdict(row) for row in self.gate_rows]

    def __str__(self) -> str:
        header = (
            f"{'':>16} {'Estimate':>12} {'Std. Error':>12} {'z value':>9} {'Pr(>|z|)':>10} "
            f"{'lower':>12} {'upper':>12}"
        )

        def number(value: float | None, spec: str, width: int) -> str:
            return f"{'NA':>{width}}" if value is None else f"{value:{width}{spec}}"

        lines = [f"log-likelihood: {self.log_likelihood:.6g}; intervals at {self.level:.0%}"]
        if self.start is not None:
            lines.append(
                "maximum-likelihood estimates of the Gaussian mixture (the highest maximum "
                f"found; EM from the {self.start}), not the served min-loss lines"
            )
        for title, rows in (("", self.rows), ("Concomitant model (gate)", self.gate_rows)):
            if title and rows:
                lines += ["", title]
            for component in sorted({row.component for row in rows}):
                lines += ["", f"$Comp.{component}", header]
                lines += [
                    f"{row.parameter[:16]:>16} {row.estimate:12.5g} "
                    f"{number(row.std_error, '.5g', 12)} {number(row.z_value, '.3f', 9)} "
                    f"{number(row.p_value, '.3g', 10)} {number(row.lower, '.5g', 12)} "
                    f"{number(row.upper, '.5g', 12)}"
                    for row in rows
                    if row.component == component
                ]
        return "\n".join(lines)


def _wald_row(
    component: int, parameter: str, estimate: float, se: float, critical: float
) -> SummaryRow:
    """A parameter's row with its Wald z against 0, two-sided p and interval."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.float64(estimate) / np.float64(se)
    return SummaryRow(
        component=component,
        parameter=parameter,
        estimate=float(estimate),
        std_error=_finite(se),
        z_value=_finite(z),
        p_value=_finite(float(two_sided_p_value(np.asarray(z)))),
        lower=_finite(estimate - critical * se),
        upper=_finite(estimate + critical * se),
    )


def gate_summary_rows(
    *,
    concomitant_names: Sequence[str],
    gate_coef: FloatArray,
    gate_intercept: FloatArray,
    gate_coef_se: FloatArray,
    gate_intercept_se: FloatArray,
    level: float,
) -> list[SummaryRow]:
    """The gate's rows of components 1..k-1 (component 0 is the reference): intercept, then
    each concomitant column, as R's ``summary(refit(m))`` lists a concomitant model."""
    critical = normal_quantile(level)
    rows = []
    for component in range(1, gate_coef.shape[0]):
        rows.append(
            _wald_row(
                component,
                INTERCEPT_NAME,
                float(gate_intercept[component]),
                float(gate_intercept_se[component]),
                critical,
            )
        )
        rows += [
            _wald_row(
                component,
                name,
                float(gate_coef[component, column]),
                float(gate_coef_se[component, column]),
                critical,
            )
            for column, name in enumerate(concomitant_names)
        ]
    return rows


def summary_table(
    *,
    feature_names: Sequence[str],
    fit_intercept: bool,
    coef: FloatArray,
    intercept: FloatArray,
    weights: FloatArray,
    noise_variance: FloatArray,
    coef_se: FloatArray,
    intercept_se: FloatArray,
    weights_se: FloatArray,
    noise_variance_se: FloatArray,
    level: float,
    log_likelihood: float,
) -> InferenceSummary:
    """Wald z, two-sided p and ``estimate -/+ z_(1+level)/2 * se`` for every parameter."""
    critical = normal_quantile(level)
    names = [*feature_names, *([INTERCEPT_NAME] if fit_intercept else [])]
    line_estimates = np.column_stack([coef, intercept]) if fit_intercept else coef
    line_se = np.column_stack([coef_se, intercept_se]) if fit_intercept else coef_se
    with np.errstate(divide="ignore", invalid="ignore"):
        z = line_estimates / line_se
    p = two_sided_p_value(z)
    rows: list[SummaryRow] = []
    for component in range(coef.shape[0]):
        for column, name in enumerate(names):
            estimate, se = (
                float(line_estimates[component, column]),
                float(line_se[component, column]),
            )
            rows.append(
                SummaryRow(
                    component=component,
                    parameter=name,
                    estimate=estimate,
                    std_error=_finite(se),
                    z_value=_finite(z[component, column]),
                    p_value=_finite(p[component, column]),
                    lower=_finite(estimate - critical * se),
                    upper=_finite(estimate + critical * se),
                )
            )
        for name, estimate, se in (
            (WEIGHT_NAME, weights[component], weights_se[component]),
            (NOISE_VARIANCE_NAME, noise_variance[component], noise_variance_se[component]),
        ):
            rows.append(
                SummaryRow(
                    component=component,
                    parameter=name,
                    estimate=float(estimate),
                    std_error=_finite(se),
                    z_value=None,
                    p_value=None,
                    lower=_finite(estimate - critical * se),
                    upper=_finite(estimate + critical * se),
                )
            )
    return InferenceSummary(rows=rows, level=level, log_likelihood=log_likelihood)
