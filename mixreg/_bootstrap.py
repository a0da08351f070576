"""Bootstrap standard errors of a mixture of regressions.

Each replicate (new targets from the fitted mixture, or rows drawn with replacement) is
refitted by the maximum-likelihood polish from the fitted lines, and its lines are matched to
the fitted ones, so line j of every replicate estimates line j. :func:`bootstrap_fit` runs it
for a fitted estimator, in the caller's units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._inference import (
    POLISH_MAX_ITER,
    POLISH_TOL,
    MixtureParameters,
    match_lines,
    maximum_likelihood_polish,
)
from ._likelihood import best_maximum_likelihood
from ._loss import single_threaded_blas
from ._scaling import Scaling, in_caller_units

FloatArray = NDArray[np.float64]
FitProgress = Callable[[float, dict[str, Any]], None]

BOOTSTRAP_KINDS = ("parametric", "empirical")
BootstrapProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class BootstrapReplicates:
    """Every replicate's maximum-likelihood fit, relabelled to the fitted lines (scaled units).

    Attributes
    ----------
    theta : ndarray of shape (n_bootstrap, n_components, n_params)
    weights, variances : ndarray of shape (n_bootstrap, n_components)
    converged : ndarray of shape (n_bootstrap,)
    """

    theta: FloatArray
    weights: FloatArray
    variances: FloatArray
    converged: NDArray[np.bool_]


def bootstrap_replicates(
    Z: FloatArray,
    y: FloatArray,
    fitted: MixtureParameters,
    *,
    n_bootstrap: int,
    kind: str,
    rng: np.random.Generator,
    progress: BootstrapProgress | None = None,
    max_iter: int = POLISH_MAX_ITER,
    tol: float = POLISH_TOL,
    newton_finish: bool = True,
) -> BootstrapReplicates:
    """Refit ``n_bootstrap`` resampled data sets by the polish started from the fitted lines.

    ``kind="parametric"`` draws new targets at the same rows from the fitted mixture (each
    row's line from the weights, then Gaussian noise of that line's variance);
    ``kind="empirical"`` draws rows with replacement. Each replicate's lines are matched to the
    fitted ones (:func:`match_lines`), so line j of every replicate estimates line j.
    ``progress(done, n_bootstrap)`` is called after every replicate; an exception raised by it
    stops the bootstrap and propagates (this is how a job is cancelled). ``newton_finish`` as
    in :func:`maximum_likelihood_polish`.
    """
    if kind not in BOOTSTRAP_KINDS:
        raise ValueError(f"kind must be one of {', '.join(BOOTSTRAP_KINDS)}; got {kind!r}")
    n_samples = y.size
    k, n_params = fitted.theta.shape
    theta = np.empty((n_bootstrap, k, n_params))
    weights = np.empty((n_bootstrap, k))
    variances = np.empty((n_bootstrap, k))
    converged = np.empty(n_bootstrap, dtype=bool)
    means = Z @ fitted.theta.T
    spreads = np.sqrt(fitted.variances)
    for replicate in range(n_bootstrap):
        if kind == "parametric":
            lines = rng.choice(k, size=n_samples, p=fitted.weights)
            rows = np.arange(n_samples)
            Z_star = Z
            y_star = means[rows, lines] + spreads[lines] * rng.standard_normal(n_samples)
        else:
            rows = rng.integers(0, n_samples, size=n_samples)
            Z_star, y_star = Z[rows], y[rows]
        polish = maximum_likelihood_polish(
            Z_star, y_star, fitted.theta, max_iter=max_iter, tol=tol, newton_finish=newton_finish
        )
        order = match_lines(fitted.theta, polish.params.theta)
        theta[replicate] = polish.params.theta[order]
        weights[replicate] = polish.params.weights[order]
        variances[replicate] = polish.params.variances[order]
        converged[replicate] = polish.converged
        if progress is not None:
            progress(replicate + 1, n_bootstrap)
    return BootstrapReplicates(
        theta=theta, weights=weights, variances=variances, converged=converged
    )


@dataclass(frozen=True)
class BootstrapResult:
    """Bootstrap standard errors and percentile intervals, in the caller's units.

    Attributes
    ----------
    kind : {"parametric", "empirical"}
    n_bootstrap : int
    level : float
        Of the percentile intervals.
    coef_se, intercept_se, weights_se, noise_variance_se : ndarray
        Standard deviations over the replicates; every ``*_interval`` field has a last axis
        (lower, upper).
    n_converged : int
        Replicates whose EM met its tolerance (the others stopped at its iteration cap).
    coef, intercept, weights, noise_variance : ndarray
        Every replicate's estimates (first axis), matched to the fitted lines.
    """

    kind: str
    n_bootstrap: int
    level: float
    coef_se: FloatArray
    intercept_se: FloatArray
    weights_se: FloatArray
    noise_variance_se: FloatArray
    coef_interval: FloatArray
    intercept_interval: FloatArray
    weights_interval: FloatArray
    noise_variance_interval: FloatArray
    n_converged: int
    coef: FloatArray
    intercept: FloatArray
    weights: FloatArray
    noise_variance: FloatArray

    @classmethod
    def of(
        cls,
        *,
        kind: str,
        level: float,
        coef: FloatArray,
        intercept: FloatArray,
        weights: FloatArray,
        noise_variance: FloatArray,
        converged: NDArray[np.bool_],
    ) -> BootstrapResult:
        """Standard deviations and ``(1 -/+ level) / 2`` quantiles over the replicates."""
        quantiles = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]

        def interval(values: FloatArray) -> FloatArray:
            return np.moveaxis(np.quantile(values, quantiles, axis=0), 0, -1)

        return cls(
            kind=kind,
            n_bootstrap=int(coef.shape[0]),
            level=level,
            coef_se=coef.std(axis=0, ddof=1),
            intercept_se=intercept.std(axis=0, ddof=1),
            weights_se=weights.std(axis=0, ddof=1),
            noise_variance_se=noise_variance.std(axis=0, ddof=1),
            coef_interval=interval(coef),
            intercept_interval=interval(intercept),
            weights_interval=interval(weights),
            noise_variance_interval=interval(noise_variance),
            n_converged=int(converged.sum()),
            coef=coef,
            intercept=intercept,
            weights=weights,
            noise_variance=noise_variance,
        )


def bootstrap_fit(
    X: FloatArray,
    y: FloatArray,
    lines: FloatArray,
    *,
    fit_intercept: bool,
    maximum_likelihood: tuple[FloatArray, FloatArray, FloatArray] | None,
    n_bootstrap: int,
    kind: str,
    level: float,
    new_generator: Callable[[], np.random.Generator],
    progress: FitProgress | None,
) -> BootstrapResult:
    """Bootstrap of a fitted estimator on its training rows (checked ``X``, ``y``), in the
    caller's units.

    The fit to resample is the maximum-likelihood fit the standard errors belong to
    (``maximum_likelihood``: its lines, weights and noise variances, polished again on these
    rows) when there is one, else the highest maximum found from the fitted ``lines``
    (coefficients then intercept). ``new_generator()`` gives each random step its generator.
    """
    scaling, Z, y_scaled = Scaling.of(X, y, fit_intercept)
    with single_threaded_blas():
        if maximum_likelihood is not None:
            ml_lines, weights, noise_variance = maximum_likelihood
            fitted = maximum_likelihood_polish(
                Z,
                y_scaled,
                scaling.to_scaled(ml_lines),
                weights=weights,
                variances=noise_variance / scaling.y_scale**2,
            ).params
        else:
            fitted = best_maximum_likelihood(
                Z, y_scaled, scaling.to_scaled(lines), rng=new_generator()
            ).params

        def report(done: int, total: int) -> None:
            if progress is not None:
                progress(
                    done / total,
                    {"iteration": done, "candidates_tried": None, "best_loss": None},
                )

        replicates = bootstrap_replicates(
            Z,
            y_scaled,
            fitted,
            n_bootstrap=n_bootstrap,
            kind=kind,
            rng=new_generator(),
            progress=report,
        )
    k, n_params = fitted.theta.shape
    coef, intercept = scaling.to_caller(replicates.theta.reshape(-1, n_params))
    return BootstrapResult.of(
        kind=kind,
        level=level,
        coef=coef.reshape(n_bootstrap, k, -1),
        intercept=intercept.reshape(n_bootstrap, k),
        weights=replicates.weights,
        noise_variance=in_caller_units(replicates.variances, scaling.y_scale**2),
        converged=replicates.converged,
    )
