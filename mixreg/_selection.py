"""Choosing k: fit every candidate number of lines and compare them by BIC, as flexmix's
``stepFlexmix`` does.

The min-loss alone always prefers more lines, so each fitted set of lines is read as a
Gaussian mixture of regressions — line j with weight ``pi_j`` (its share of the rows) and noise
variance ``sigma_j^2`` (the mean squared residual of the rows it predicts best) — and scored by
the Bayesian information criterion of that mixture.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._estimator import MixtureOfLinearRegressions
from ._loss import predict_lines
from ._validation import check_X_y

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]

# Noise variances are floored at this fraction of var(y) (as EM floors them), so a line that
# fits a few rows exactly cannot make the likelihood infinite.
_VARIANCE_FLOOR = 1e-8


@dataclass(frozen=True)
class MixtureScore:
    """A fitted set of lines read as a Gaussian mixture of regressions."""

    log_likelihood: float
    """Total log-likelihood of the rows."""
    n_parameters: int
    """Coefficients and intercepts of every line, its variance, and k - 1 free weights."""
    bic: float
    """``-2 log_likelihood + n_parameters log(n_samples)``: lower is better."""


def mixture_score(
    X: ArrayLike, y: ArrayLike, coef: ArrayLike, intercept: ArrayLike, *, fit_intercept: bool
) -> MixtureScore:
    """BIC of lines read as a Gaussian mixture (shares as weights, per-line noise variance).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    coef : array-like of shape (n_components, n_features)
    intercept : array-like of shape (n_components,)
    fit_intercept : bool
        Whether the intercepts were fitted (they count as parameters then).

    Returns
    -------
    MixtureScore
    """
    X_arr, y_arr = check_X_y(X, y)
    coef_arr = np.asarray(coef, dtype=np.float64)
    intercept_arr = np.asarray(intercept, dtype=np.float64)
    n_samples = X_arr.shape[0]
    n_components, n_features = coef_arr.shape
    squared = (predict_lines(X_arr, coef_arr, intercept_arr) - y_arr[:, None]) ** 2
    labels = np.argmin(squared, axis=1)
    counts = np.bincount(labels, minlength=n_components)
    shares = counts / n_samples
    won = np.bincount(labels, weights=squared[np.arange(n_samples), labels], minlength=n_components)
    floor = _VARIANCE_FLOOR * float(np.var(y_arr)) + np.finfo(np.float64).tiny
    variances = np.maximum(won / np.maximum(counts, 1), floor)
    # Lines that predict no row best have weight 0: they add nothing to the likelihood.
    used = shares > 0
    log_density = (
        np.log(shares[used])
        - 0.5 * np.log(2.0 * np.pi * variances[used])
        - squared[:, used] / (2.0 * variances[used])
    )
    top = log_density.max(axis=1)
    log_likelihood = float(np.sum(top + np.log(np.exp(log_density - top[:, None]).sum(axis=1))))
    n_parameters = n_components * (n_features + fit_intercept) + n_components + n_components - 1
    bic = -2.0 * log_likelihood + n_parameters * float(np.log(n_samples))
    return MixtureScore(log_likelihood=log_likelihood, n_parameters=n_parameters, bic=bic)


@dataclass(frozen=True)
class ComponentsFit:
    """The fit for one number of lines."""

    n_components: int
    estimator: MixtureOfLinearRegressions
    train_min_loss: float
    score: MixtureScore


@dataclass(frozen=True)
class NComponentsSelection:
    """Every k tried, in increasing order, and the one BIC prefers."""

    fits: list[ComponentsFit]
    best_n_components: int

    @property
    def best_estimator(self) -> MixtureOfLinearRegressions:
        """The fitted estimator of the preferred k."""
        return next(
            fit.estimator for fit in self.fits if fit.n_components == self.best_n_components
        )


def check_n_components_list(n_components: Any, n_samples: int | None = None) -> list[int]:
    """The k values of a sweep, in increasing order, or ValueError naming what is wrong."""
    if isinstance(n_components, str | bytes) or not isinstance(n_components, Sequence):
        raise ValueError(f"n_components must be a list of integers; got {n_components!r}")
    if len(n_components) == 0:
        raise ValueError("n_components is an empty list; give at least one number of lines")
    values: list[int] = []
    seen: set[int] = set()
    for position, value in enumerate(n_components):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"n_components[{position}] must be an integer >= 1; got {value!r}")
        k = int(value)
        if k in seen:
            raise ValueError(f"n_components lists k={k} twice; give each k once")
        seen.add(k)
        if n_samples is not None and k > n_samples:
            raise ValueError(f"n_components[{position}]={k} exceeds the {n_samples} training rows")
        values.append(k)
    return sorted(values)


def select_n_components(
    X: ArrayLike,
    y: ArrayLike,
    n_components: Sequence[int] = (1, 2, 3, 4, 5),
    *,
    progress: ProgressCallback | None = None,
    **params: Any,
) -> NComponentsSelection:
    """Fit one mixture per number of lines and pick the number BIC prefers.

    Every k is fitted on the same rows with the same estimator parameters (an integer
    ``random_state`` seeds each fit alike), like flexmix's ``stepFlexmix``. With ``auto`` (the
    default) and no ``init``, each k after k - 1 also starts from the (k - 1)-line fit plus one
    line (:func:`one_more_line`), one more candidate of its search.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    n_components : sequence of int, default=(1, 2, 3, 4, 5)
        The numbers of lines to try; each at most once.
    progress : callable, optional
        ``progress(fraction, info)`` over the whole sweep; ``info`` also holds
        ``n_components``, the k being fitted. An exception raised by it stops the sweep.
    **params
        Parameters of :class:`MixtureOfLinearRegressions` (``algorithm``, ``random_state``, ...).

    Returns
    -------
    NComponentsSelection
        Ties in BIC go to the smaller k.
    """
    X_arr, y_arr = check_X_y(X, y)
    values = check_n_components_list(n_components, X_arr.shape[0])
    fits: list[ComponentsFit] = []
    warm = params.get("algorithm", "auto") == "auto" and params.get("init") is None
    for position, k in enumerate(values):
        sweep_progress = None
        if progress is not None:

            def sweep_progress(
                fraction: float, info: dict[str, Any], position: int = position, k: int = k
            ) -> None:
                progress((position + fraction) / len(values), {**info, "n_components": k})

        init = None
        if warm and fits and fits[-1].n_components == k - 1:
            init = one_more_line(X_arr, y_arr, fits[-1].estimator)
        estimator = MixtureOfLinearRegressions(n_components=k, **{**params, "init": init})
        estimator.fit(X_arr, y_arr, progress=sweep_progress)
        score = mixture_score(
            X_arr,
            y_arr,
            estimator.coef_,
            estimator.intercept_,
            fit_intercept=bool(estimator.fit_intercept),
        )
        fits.append(ComponentsFit(k, estimator, estimator.train_loss_, score))
    best = preferred_n_components([(fit.n_components, fit.score.bic) for fit in fits])
    return NComponentsSelection(fits=fits, best_n_components=best)


def one_more_line(X: FloatArray, y: FloatArray, fitted: MixtureOfLinearRegressions) -> FloatArray:
    """The lines of a fit plus the least-squares line of the rows they fit worst.

    The worst rows are the ``1 / (k + 1)`` share with the largest smallest squared residual,
    ``k`` the fit's number of lines: where a (k + 1)-th line is most likely needed.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    fitted : MixtureOfLinearRegressions
        A fitted estimator with k lines.

    Returns
    -------
    ndarray of shape (k + 1, n_features + fit_intercept)
        Coefficients, then the intercept when the fit has one: ``init`` of a (k + 1)-line fit.
    """
    k = fitted.coef_.shape[0]
    residuals = np.min(
        (predict_lines(X, fitted.coef_, fitted.intercept_) - y[:, None]) ** 2, axis=1
    )
    n_worst = max(X.shape[1] + 1, X.shape[0] // (k + 1))
    worst = np.argsort(residuals, kind="stable")[-n_worst:]
    design = X[worst]
    lines = fitted.coef_
    if fitted.fit_intercept:
        design = np.column_stack([design, np.ones(n_worst)])
        lines = np.column_stack([fitted.coef_, fitted.intercept_])
    new_line, *_ = np.linalg.lstsq(design, y[worst], rcond=None)
    grown: FloatArray = np.vstack([lines, new_line])
    return grown


def preferred_n_components(bics: Sequence[tuple[int, float]]) -> int:
    """The k of lowest BIC among ``(k, bic)`` pairs; ties go to the smaller k."""
    return min(bics, key=lambda pair: (pair[1], pair[0]))[0]
