"""Choosing k: fit every candidate number of lines and compare them by BIC, as flexmix's
``stepFlexmix`` does.

The min-loss alone always prefers more lines, so each fitted set of lines is read as a
Gaussian mixture of regressions — line j with weight ``pi_j`` (its share of the rows) and noise
variance ``sigma_j^2`` (the mean squared residual of the rows it predicts best) — and scored by
the Bayesian information criterion of that mixture.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._estimator import MixtureOfLinearRegressions
from ._fit_warnings import DegenerateFitWarning, minimum_rows_per_line
from ._inference import MixtureParameters
from ._likelihood import best_maximum_likelihood, split_starts
from ._loss import Grouping, predict_lines, single_threaded_blas, weighted_mean
from ._partition_moments import refit_exactly
from ._scaling import Scaling
from ._validation import check_groups, check_sample_weight, check_X_y

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]

# Noise variances are floored at this fraction of the residual variance of one
# least-squares line: a line through a few rows cannot make the likelihood grow without bound,
# and the floor, the same for every k on the same rows, keeps the mixtures of different k
# comparable (the likelihood of k + 1 lines is never below that of k).
VARIANCE_FLOOR_SHARE = 1e-2
LIKELIHOOD_DROP_SLACK = 0.01
"""A k sweep's log-likelihood may fall by this much as k grows before a warning names k."""


@dataclass(frozen=True)
class MixtureScore:
    """A fitted set of lines read as a Gaussian mixture of regressions."""

    log_likelihood: float
    """Total log-likelihood of the rows at the highest maximum found (see
    :func:`mixture_score`)."""
    n_parameters: int
    """Coefficients and intercepts of every line, its variance, and k - 1 free weights."""
    bic: float
    """``-2 log_likelihood + n_parameters log(n_samples)``: lower is better."""
    ml_lines: FloatArray | None = field(default=None, compare=False, repr=False)
    """The maximum-likelihood lines (caller's units; per line its coefficients, then the
    intercept when fitted)."""
    ml_weights: FloatArray | None = field(default=None, compare=False, repr=False)
    ml_variances: FloatArray | None = field(default=None, compare=False, repr=False)
    """The maximum's mixing weights and noise variances (caller's units): with ``ml_lines``,
    the mixture a k sweep splits to start the next k."""
    start: str = ""
    """Where EM started that reached the maximum: ``"min-loss lines"``, ``"em restart"`` or
    ``"split of k - 1"`` (the (k - 1)-line maximum with one line split in two)."""


def mixture_score(
    X: ArrayLike,
    y: ArrayLike,
    coef: ArrayLike,
    intercept: ArrayLike,
    *,
    fit_intercept: bool,
    sample_weight: ArrayLike | None = None,
    groups: ArrayLike | None = None,
    previous: MixtureScore | None = None,
    random_state: Any = 0,
) -> MixtureScore:
    """BIC of lines read as a Gaussian mixture of regressions, at the highest maximum of its
    likelihood found.

    The maximum is :func:`~mixreg._likelihood.best_maximum_likelihood`'s: the highest that EM
    reaches from the lines (weights and variances from the partition they induce), from 10
    random partitions of the rows (flexmix's starts) and, given ``previous``, from the (k -
    1)-line maximum with one of its lines split in two (one start per line; so its
    likelihood is about that of k - 1 or higher). Each noise variance is floored at
    :data:`VARIANCE_FLOOR_SHARE` times the residual variance of one least-squares line (so a
    line through a handful of rows cannot make the likelihood unbounded), and a maximum at
    which a line owns fewer rows than its coefficients plus three is not kept.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    coef : array-like of shape (n_components, n_features)
    intercept : array-like of shape (n_components,)
    fit_intercept : bool
        Whether the intercepts were fitted (they count as parameters then).
    sample_weight : array-like of shape (n_samples,), optional
        Replication weights: the log-likelihood is the weighted sum over rows and the BIC's
        number of observations is the total weight, so integer weights score as the
        repeated rows would (from the same starts).
    groups : array-like of shape (n_samples,), optional
        A label per row: the mixture is the grouped one (every group's rows from one line,
        as flexmix's ``y ~ x | g``), its likelihood the product over groups of each group's
        mixture density. The BIC's number of observations stays the rows' (their total
        weight), as flexmix counts them.
    previous : MixtureScore, optional
        The score of the same rows with one line fewer (a k sweep's): its maximum, split, gives
        more starts.
    random_state : int, numpy.random.Generator or None, default=0
        Draws the random partitions (and the rows EM runs its starts on, above 20,000).

    Returns
    -------
    MixtureScore
    """
    X_arr, y_arr = check_X_y(X, y)
    codes = None if groups is None else check_groups(groups, len(y_arr))[1]
    weights = None
    if sample_weight is not None:
        weights = check_sample_weight(sample_weight, len(y_arr))
        kept = weights > 0
        X_arr, y_arr, weights = X_arr[kept], y_arr[kept], weights[kept]
        if codes is not None:
            codes = np.unique(codes[kept], return_inverse=True)[1].ravel()
    grouping = None if codes is None else Grouping.of(codes)
    coef_arr = np.asarray(coef, dtype=np.float64)
    intercept_arr = np.asarray(intercept, dtype=np.float64)
    n_samples = X_arr.shape[0]
    n_observations = float(n_samples if weights is None else weights.sum())
    n_components, n_features = coef_arr.shape
    scaling, Z, y_scaled = Scaling.of(X_arr, y_arr, fit_intercept, weights)
    lines = np.column_stack([coef_arr, intercept_arr]) if fit_intercept else coef_arr
    starts: list[tuple[str, MixtureParameters]] = []
    if (
        previous is not None
        and previous.ml_lines is not None
        and previous.ml_weights is not None
        and previous.ml_variances is not None
    ):
        if previous.ml_lines.shape != (n_components - 1, lines.shape[1]):
            raise ValueError(
                f"previous: its {previous.ml_lines.shape[0]} lines of "
                f"{previous.ml_lines.shape[1]} parameters are not one line fewer than these "
                f"{n_components} of {lines.shape[1]}"
            )
        starts = split_starts(
            MixtureParameters(
                theta=scaling.to_scaled(previous.ml_lines),
                weights=previous.ml_weights,
                variances=previous.ml_variances / scaling.y_scale**2,
            )
        )
    with single_threaded_blas():
        one_line, _ = refit_exactly(
            Z, y_scaled, np.zeros(n_samples, dtype=np.intp), 1, sample_weight=weights
        )
        residual = y_scaled - Z @ one_line[0]
        if weights is None:
            floor = VARIANCE_FLOOR_SHARE * float(residual @ residual) / n_samples
        else:
            floor = VARIANCE_FLOOR_SHARE * float(weighted_mean(residual * residual, weights))
        fit = best_maximum_likelihood(
            Z,
            y_scaled,
            scaling.to_scaled(lines),
            rng=np.random.default_rng(random_state)
            if not isinstance(random_state, np.random.Generator)
            else random_state,
            starts=starts,
            sample_weight=weights,
            grouping=grouping,
            variance_floor=max(floor, np.finfo(np.float64).tiny),
        )
    # The density of y is that of the scaled target divided by the scale.
    log_likelihood = fit.log_likelihood - n_observations * float(np.log(scaling.y_scale))
    n_parameters = n_components * (n_features + fit_intercept) + n_components + n_components - 1
    ml_coef, ml_intercept = scaling.to_caller(fit.params.theta)
    score = _score(log_likelihood, n_parameters, n_observations)
    ml_lines = np.column_stack([ml_coef, ml_intercept]) if fit_intercept else ml_coef
    return replace(
        score,
        ml_lines=ml_lines,
        ml_weights=fit.params.weights,
        ml_variances=fit.params.variances * scaling.y_scale**2,
        start=fit.start,
    )


def _score(log_likelihood: float, n_parameters: int, n_samples: float) -> MixtureScore:
    bic = -2.0 * log_likelihood + n_parameters * float(np.log(n_samples))
    return MixtureScore(log_likelihood=log_likelihood, n_parameters=n_parameters, bic=bic)


class SweepLikelihoodWarning(UserWarning):
    """A k sweep's likelihood fell as k grew: more search could find the larger k's maximum."""


def likelihood_drops(scores: Sequence[tuple[int, MixtureScore]]) -> list[tuple[int, str]]:
    """Each k of a sweep whose maximized likelihood is below a smaller k's, with a message.

    A mixture of k lines contains every mixture of fewer lines (the extra lines with weight
    zero), so its highest maximum is at least theirs; when the k-line maximum found is lower,
    the search missed it. The score stays that of the fit at k (never a smaller k's value
    carried forward), and the message says so.

    Parameters
    ----------
    scores : sequence of (k, MixtureScore)
        In any order.

    Returns
    -------
    list of (k, message)
        In increasing k; each message begins with ``k=K:``.
    """
    drops: list[tuple[int, str]] = []
    best_below, best_k = -np.inf, 0
    for k, score in sorted(scores, key=lambda pair: pair[0]):
        # Rounding of a sum over the rows, and EM's stop a hair below a maximum on the
        # boundary (the smaller k's lines with one more of weight near zero), are no drop.
        slack = LIKELIHOOD_DROP_SLACK + 1e-9 * abs(score.log_likelihood)
        if score.log_likelihood < best_below - slack:
            drops.append(
                (
                    k,
                    f"k={k}: the maximized log-likelihood {score.log_likelihood:.6g} is below "
                    f"k={best_k}'s {best_below:.6g} although {k} lines contain every mixture "
                    f"of {best_k}; the BIC of k={k} is that of the maximum found at k={k} (a "
                    "longer search, e.g. a larger n_init, may find a higher one)",
                )
            )
        if score.log_likelihood > best_below:
            best_below, best_k = score.log_likelihood, k
    return drops


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


def check_n_components_list(
    n_components: Any, n_samples: int | None = None, n_params: int | None = None
) -> list[int]:
    """The k values of a sweep, in increasing order, or ValueError naming what is wrong.

    With ``n_samples`` and ``n_params`` (features plus the intercept), a k whose lines cannot
    each own :func:`~mixreg.service_support.minimum_rows_per_line` training rows is refused too.
    """
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
        if (
            n_samples is not None
            and n_params is not None
            and too_many_lines(k, n_samples, n_params)
        ):
            raise ValueError(
                f"n_components[{position}]={k}: {k} lines need at least "
                f"{k * minimum_rows_per_line(n_params)} training rows "
                f"({minimum_rows_per_line(n_params)} per line of {n_params} coefficients), "
                f"there are {n_samples}; sweep "
                f"k <= {max(1, n_samples // minimum_rows_per_line(n_params))}"
            )
        values.append(k)
    return sorted(values)


def too_many_lines(n_components: int, n_samples: int, n_params: int) -> bool:
    """Whether ``n_components`` lines cannot each own enough of ``n_samples`` rows to be fitted
    and have a noise estimate (:func:`~mixreg.service_support.minimum_rows_per_line`)."""
    return n_components > 1 and n_components * minimum_rows_per_line(n_params) > n_samples


def select_n_components(
    X: ArrayLike,
    y: ArrayLike,
    n_components: Sequence[int] = (1, 2, 3, 4, 5),
    *,
    sample_weight: ArrayLike | None = None,
    groups: ArrayLike | None = None,
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
        The numbers of lines to try; each at most once. A k whose lines cannot each own
        :func:`~mixreg.service_support.minimum_rows_per_line` rows is skipped with a
        :class:`~mixreg.DegenerateFitWarning` naming it.
    sample_weight : array-like of shape (n_samples,), optional
        Row weights of every fit and score (:func:`mixture_score`: the BIC counts the total
        weight as the number of observations).
    groups : array-like of shape (n_samples,), optional
        A label per row: every fit binds a group's rows to one line (``auto``, ``am-classic``
        or ``em``) and every score is the grouped mixture's (:func:`mixture_score`).
    progress : callable, optional
        ``progress(fraction, info)`` over the whole sweep; ``info`` also holds
        ``n_components``, the k being fitted. An exception raised by it stops the sweep.
    **params
        Parameters of :class:`MixtureOfLinearRegressions` (``algorithm``, ``random_state``, ...).

    Returns
    -------
    NComponentsSelection
        Ties in BIC go to the smaller k. Scores are :func:`mixture_score`'s, each from the
        maximum found at its k (from the k-line fit, random partitions and the (k - 1)-line
        maximum plus one line); a k whose maximum is below a smaller k's is kept as found,
        with a :class:`SweepLikelihoodWarning` naming it. Warnings of a k's fit are issued
        again prefixed with ``k=K:``.
    """
    X_arr, y_arr = check_X_y(X, y)
    weights = None if sample_weight is None else check_sample_weight(sample_weight, len(y_arr))
    n_samples, n_features = X_arr.shape
    n_params = n_features + bool(params.get("fit_intercept", True))
    requested = check_n_components_list(n_components, n_samples)
    values = [k for k in requested if not too_many_lines(k, n_samples, n_params)]
    skipped = [k for k in requested if k not in values]
    if not values:
        raise ValueError(
            f"every k of n_components={list(requested)} needs more than the {n_samples} "
            f"training rows ({minimum_rows_per_line(n_params)} per line); try k=1"
        )
    if skipped:
        warnings.warn(
            f"k={', '.join(map(str, skipped))} skipped: {n_samples} training rows cannot give "
            f"each of k lines the {minimum_rows_per_line(n_params)} rows a line of {n_params} "
            f"coefficients needs (k <= {n_samples // minimum_rows_per_line(n_params)})",
            DegenerateFitWarning,
            stacklevel=2,
        )
    estimators: list[MixtureOfLinearRegressions] = []
    scores: list[tuple[int, MixtureScore]] = []
    previous: MixtureOfLinearRegressions | None = None
    previous_score: MixtureScore | None = None
    previous_k = 0
    for position, k in enumerate(values):
        sweep_progress = None
        if progress is not None:

            def sweep_progress(
                fraction: float, info: dict[str, Any], position: int = position, k: int = k
            ) -> None:
                progress((position + fraction) / len(values), {**info, "n_components": k})

        init = sweep_warm_start(X_arr, y_arr, k, previous, params)
        estimator = MixtureOfLinearRegressions(n_components=k, **{**params, "init": init})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            estimator.fit(X_arr, y_arr, weights, groups, progress=sweep_progress)
        for warning in caught:
            # Each k's warnings say which k they are about.
            warnings.warn(f"k={k}: {warning.message}", warning.category, stacklevel=2)
        estimators.append(estimator)
        previous = estimator
        score = mixture_score(
            X_arr,
            y_arr,
            estimator.coef_,
            estimator.intercept_,
            fit_intercept=bool(estimator.fit_intercept),
            sample_weight=weights,
            groups=groups,
            previous=previous_score if previous_k == k - 1 else None,
            random_state=_score_seed(params.get("random_state")),
        )
        scores.append((k, score))
        previous_score, previous_k = score, k
    for _, message in likelihood_drops(scores):
        warnings.warn(message, SweepLikelihoodWarning, stacklevel=2)
    fits = [
        ComponentsFit(k, estimator, estimator.train_loss_, score)
        for k, estimator, (_, score) in zip(values, estimators, scores, strict=True)
    ]
    best = preferred_n_components([(fit.n_components, fit.score.bic) for fit in fits])
    return NComponentsSelection(fits=fits, best_n_components=best)


def _score_seed(random_state: Any) -> Any:
    """The seed of a sweep's scores: the fits' integer seed (each k scored alike), else 0 (a
    generator given to the fits is theirs to advance)."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return int(random_state)
    return 0


def sweep_warm_start(
    X: FloatArray,
    y: FloatArray,
    n_components: int,
    previous: MixtureOfLinearRegressions | None,
    params: Mapping[str, Any],
) -> FloatArray | None:
    """The starting lines a k sweep gives its k-line fit: the (k - 1)-line fit plus one line.

    Every k sweep (:func:`select_n_components`, the service's k sweeps) starts its fits this
    way, so that the k-line search starts no worse than the (k - 1)-line fit: its min-loss
    with one line more is at most the (k - 1)-line min-loss.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    n_components : int
        The k about to be fitted.
    previous : MixtureOfLinearRegressions or None
        The sweep's fit before this one (None for its first).
    params : mapping
        Parameters of :class:`MixtureOfLinearRegressions` the sweep fits with.

    Returns
    -------
    ndarray of shape (k, n_features + fit_intercept) or None
        :func:`one_more_line` of ``previous`` when the algorithm is ``auto`` (where ``init`` is
        one more candidate of the search), no ``init`` is given and ``previous`` has k - 1
        lines; None otherwise (the fit starts as it would alone).
    """
    if params.get("algorithm", "auto") != "auto" or params.get("init") is not None:
        return None
    if previous is None or previous.n_components != n_components - 1:
        return None
    return one_more_line(X, y, previous)


def one_more_line(X: FloatArray, y: FloatArray, fitted: MixtureOfLinearRegressions) -> FloatArray:
    """The lines of a fit plus the least-squares line of the rows they fit worst
    (:func:`lines_plus_one` of its lines).

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
    lines = (
        np.column_stack([fitted.coef_, fitted.intercept_]) if fitted.fit_intercept else fitted.coef_
    )
    return lines_plus_one(X, y, lines, fit_intercept=bool(fitted.fit_intercept))


def lines_plus_one(
    X: FloatArray, y: FloatArray, lines: FloatArray, *, fit_intercept: bool
) -> FloatArray:
    """Lines plus the least-squares line of the rows they fit worst.

    The worst rows are the ``1 / (k + 1)`` share with the largest smallest squared residual,
    ``k`` the number of lines: where a (k + 1)-th line is most likely needed.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    lines : ndarray of shape (k, n_features + fit_intercept)
        Per line its coefficients, then its intercept when ``fit_intercept``.
    fit_intercept : bool

    Returns
    -------
    ndarray of shape (k + 1, n_features + fit_intercept)
    """
    k, n_features = lines.shape[0], X.shape[1]
    coef = lines[:, :n_features]
    intercept = lines[:, n_features] if fit_intercept else np.zeros(k)
    residuals = np.min((predict_lines(X, coef, intercept) - y[:, None]) ** 2, axis=1)
    n_worst = max(n_features + 1, X.shape[0] // (k + 1))
    worst = np.argsort(residuals, kind="stable")[-n_worst:]
    design = X[worst]
    if fit_intercept:
        design = np.column_stack([design, np.ones(n_worst)])
    new_line, *_ = np.linalg.lstsq(design, y[worst], rcond=None)
    grown: FloatArray = np.vstack([lines, new_line])
    return grown


def preferred_n_components(bics: Sequence[tuple[int, float]]) -> int:
    """The k of lowest BIC among ``(k, bic)`` pairs; ties go to the smaller k."""
    return min(bics, key=lambda pair: (pair[1], pair[0]))[0]
