"""Fitting a spec on its split, and the records a fit leaves: the mixture of each k, the
least-squares baseline, warnings, groups' metrics, the gate and the uncertainty.

A k sweep fits every k on the same split with the same seed, one after the other (with
``auto``, each k also starts from the (k - 1)-line fit plus one line, as
:func:`mixreg.select_n_components` does: :func:`mixreg.service_support.sweep_warm_start`).
Warnings of the fit (``ConvergenceWarning`` and ``mixreg``'s own) and a holdout min-loss
above the baseline's are recorded on the model and the job, which still succeeds.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression

import mixreg
from mixreg import (
    BootstrapResult,
    MixtureOfLinearRegressions,
    MixtureScore,
    SummaryRow,
    min_loss,
    mixture_score,
    predict_lines,
)
from mixreg.service_support import likelihood_drops, preferred_n_components, sweep_warm_start
from service.fit_schemas import AUTO_STANDARD_ERRORS_MAX_ROWS
from service.jobs import fit_memory
from service.jobs.fit_spec import (
    BASELINE_TIE_RTOL,
    FitSpec,
    FloatArray,
    IndexArray,
    ProgressCallback,
    TrainHoldout,
    baseline_comparison,
    beats_baseline,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FittedMixture:
    """A fitted mixture with its scores and the baseline, ready to be stored."""

    n_components: int
    params: dict[str, Any]
    """The parameters the fit ran with, size-aware defaults resolved."""
    coef: FloatArray
    intercept: FloatArray
    shares: FloatArray
    train_min_loss: float
    holdout_min_loss: float | None
    baseline: dict[str, Any]
    n_train: int
    n_holdout: int
    loss_history: list[float]
    n_iter: int
    fit_seconds: float
    converged: bool
    score: MixtureScore
    """The lines as a Gaussian mixture on the training rows (log-likelihood, BIC)."""
    candidates: list[dict[str, Any]] | None
    """``auto``'s record of every candidate it tried; None for other algorithms."""
    warnings: list[str] = field(default_factory=list)
    group_labels: NDArray[Any] | None = None
    """A grouped fit's training groups (sorted), and the line of each."""
    group_lines: IndexArray | None = None
    group_posteriors: FloatArray | None = None
    """An ``em`` grouped fit's posterior of each training group over the lines."""
    group_metrics: dict[str, Any] | None = None
    """A grouped fit's group counts and min-losses with every group on its own best line."""
    uncertainty: dict[str, Any] | None = None
    """Per line, estimates with standard errors and intervals (``uncertainty_record``)."""
    gate: dict[str, Any] | None = None
    """The fitted gate (``gate_record``) of a gated fit."""

    @property
    def beats_baseline(self) -> bool:
        """Whether its min-loss is below the one-line baseline's (see ``beats_baseline``)."""
        return beats_baseline(
            train_min_loss=self.train_min_loss,
            holdout_min_loss=self.holdout_min_loss,
            baseline=self.baseline,
        )


@dataclass(frozen=True)
class FittedSweep:
    """The fit of every k of a job (one for a single k), and the k that BIC prefers."""

    fits: list[FittedMixture]
    best_n_components: int

    @property
    def best(self) -> FittedMixture:
        """The fit of the preferred k."""
        return next(fit for fit in self.fits if fit.n_components == self.best_n_components)


def _poor_fit_warning(
    spec: FitSpec,
    n_components: int,
    n_train: int,
    *,
    train_min_loss: float,
    holdout_min_loss: float | None,
    baseline: Mapping[str, Any],
) -> str | None:
    """A warning if the mixture does worse than the single least-squares line."""
    split, loss, reference = baseline_comparison(
        train_min_loss=train_min_loss, holdout_min_loss=holdout_min_loss, baseline=baseline
    )
    if loss <= reference + BASELINE_TIE_RTOL * abs(reference):
        return None
    rows = "predict the held-out rows" if split == "holdout" else "fit the training rows"
    if spec.algorithm == "auto":
        advice = (
            f"with {n_train} training rows for {n_components} lines they may fit noise; "
            f"try fewer components or more rows"
        )
    else:
        advice = (
            f"{spec.algorithm} may have stopped too early or in a poor local optimum; try "
            f"algorithm 'auto' (the best of many starts, each polished by classical AM) or "
            f"fewer components"
        )
    return (
        f"{split} min-loss {loss:.6g} is above the one-line least-squares baseline's "
        f"{reference:.6g}: the {n_components} lines {rows} worse than a single line; {advice}"
    )


_MIXREG_DIR = Path(mixreg.__file__).resolve().parent


def _is_fit_warning(warning: warnings.WarningMessage) -> bool:
    """A warning about the fit itself, worth keeping on its record."""
    if issubclass(warning.category, ConvergenceWarning):
        return True
    return Path(warning.filename).resolve().is_relative_to(_MIXREG_DIR)


def _fit_recording_warnings(
    estimator: MixtureOfLinearRegressions,
    X: FloatArray,
    y: FloatArray,
    progress: ProgressCallback | None,
    weights: FloatArray | None = None,
    groups: NDArray[Any] | None = None,
    concomitant: FloatArray | None = None,
) -> list[str]:
    """Fit ``estimator`` and return the messages of the warnings it gave about the fit.

    Other warnings are issued again, as if nothing had caught them.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, y, weights, groups, progress=progress, concomitant=concomitant)
    kept: list[str] = []
    for warning in caught:
        if not _is_fit_warning(warning):
            warnings.warn_explicit(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
                source=warning.source,
            )
        elif str(warning.message) not in kept:
            kept.append(str(warning.message))
    return kept


def _line_min_loss(
    X: FloatArray,
    y: FloatArray,
    coef: FloatArray,
    intercept: FloatArray,
    weights: FloatArray | None = None,
) -> float:
    return float(min_loss(y, predict_lines(X, coef, intercept), weights))


def least_squares_baseline(
    X_train: FloatArray,
    y_train: FloatArray,
    X_holdout: FloatArray,
    y_holdout: FloatArray,
    *,
    fit_intercept: bool,
    weights_train: FloatArray | None = None,
    weights_holdout: FloatArray | None = None,
) -> dict[str, Any]:
    """The single (weighted) least-squares line on the training rows and its (weighted)
    min-loss on both splits."""
    regression = LinearRegression(fit_intercept=fit_intercept).fit(
        X_train, y_train, sample_weight=weights_train
    )
    coef = np.asarray(regression.coef_, dtype=np.float64).reshape(1, -1)
    intercept = np.asarray([regression.intercept_], dtype=np.float64).reshape(1)
    return {
        "coef": coef[0].tolist(),
        "intercept": float(intercept[0]),
        "train_min_loss": _line_min_loss(X_train, y_train, coef, intercept, weights_train),
        "holdout_min_loss": (
            _line_min_loss(X_holdout, y_holdout, coef, intercept, weights_holdout)
            if len(y_holdout)
            else None
        ),
    }


def fit_mixture(
    X: FloatArray, y: FloatArray, spec: FitSpec, *, progress: ProgressCallback | None = None
) -> FittedMixture:
    """Split off the holdout, fit the mixture and the baseline on the training rows, score both.

    Raises ``ValueError`` with a user-facing message when ``mixreg`` rejects the arguments or
    the data are too extreme for float64 arithmetic.
    """
    return fit_sweep(X, y, replace(spec, k_values=None), progress=progress).best


def fit_sweep(
    X: FloatArray, y: FloatArray, spec: FitSpec, *, progress: ProgressCallback | None = None
) -> FittedSweep:
    """Fit every k of ``spec`` on the same training rows with the same seed; prefer by BIC.

    ``progress`` sees the fraction of the whole sweep, and the k being fitted as
    ``info["n_components"]``. Each k gets the whole time budget; with ``auto`` each k also
    starts from the (k - 1)-line fit plus one line
    (:func:`mixreg.service_support.sweep_warm_start`). Ties in BIC go to the smaller k.
    Raises ``ValueError`` like :func:`fit_mixture`.
    """
    return fit_split(TrainHoldout.of_arrays(X, y, spec), spec, progress=progress)


def fit_split(
    split: TrainHoldout, spec: FitSpec, *, progress: ProgressCallback | None = None
) -> FittedSweep:
    """``fit_sweep`` on data already split by ``TrainHoldout``."""
    X_train, y_train = split.X_train, split.y_train
    all_k = spec.all_n_components
    # Overflow is reported by check_finite_result as a precise error instead of as
    # RuntimeWarnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        baseline = least_squares_baseline(
            X_train,
            y_train,
            split.X_holdout,
            split.y_holdout,
            fit_intercept=spec.fit_intercept,
            weights_train=split.weights_train,
            weights_holdout=split.weights_holdout,
        )
        fits: list[FittedMixture] = []
        previous: MixtureOfLinearRegressions | None = None
        for position, k in enumerate(all_k):
            estimator = spec.estimator(k)
            init = sweep_warm_start(
                split.X_train,
                split.y_train,
                k,
                previous,
                {**spec.params, "algorithm": spec.algorithm},
            )
            fits.append(
                _fit_one(
                    spec,
                    estimator,
                    init,
                    split,
                    baseline,
                    _sweep_progress(progress, position, len(all_k), k),
                    previous_score=(
                        fits[-1].score if fits and fits[-1].n_components == k - 1 else None
                    ),
                )
            )
            previous = estimator
    # k lines contain every mixture of fewer: a k whose maximum found is lower says so.
    drops = dict(likelihood_drops([(fit.n_components, fit.score) for fit in fits]))
    fits = [
        replace(fit, warnings=[*fit.warnings, drops[fit.n_components]])
        if fit.n_components in drops
        else fit
        for fit in fits
    ]
    best = preferred_n_components([(fit.n_components, fit.score.bic) for fit in fits])
    return FittedSweep(fits=fits, best_n_components=best)


def _sweep_progress(
    progress: ProgressCallback | None, position: int, count: int, n_components: int
) -> ProgressCallback | None:
    if progress is None:
        return None

    def report(fraction: float, info: dict[str, Any]) -> None:
        progress((position + fraction) / count, {**info, "n_components": n_components})

    return report


def gate_record(
    estimator: MixtureOfLinearRegressions, split: TrainHoldout, spec: FitSpec
) -> dict[str, Any]:
    """What a gated model stores of its gate: the model document's gate (coefficients,
    intercepts, noise variances, log-likelihood, BIC), gated EM's iterations and convergence,
    and on the holdout the log-likelihood and the RMSE of the expected and of the most likely
    value (None without a holdout); with weights, each holdout row counts its weight."""
    gate = estimator.to_dict(concomitant_names=spec.concomitant_names)["gate"]
    holdout = None
    weights = split.weights_holdout
    if len(split.y_holdout) and (weights is None or weights.sum() > 0):
        X, y, Z = split.X_holdout, split.y_holdout, split.Z_holdout
        holdout = {
            "log_likelihood": estimator.gated_log_likelihood(X, y, Z, weights),
            "rmse_expected": float(
                np.sqrt(np.average((y - estimator.predict_expected(X, Z)) ** 2, weights=weights))
            ),
            "rmse_most_likely": float(
                np.sqrt(np.average((y - estimator.predict_most_likely(X, Z)) ** 2, weights=weights))
            ),
        }
    return {
        **gate,
        "n_iter": int(estimator.gate_n_iter_),
        "converged": bool(estimator.gate_converged_),
        "holdout": holdout,
    }


def _fit_one(
    spec: FitSpec,
    estimator: MixtureOfLinearRegressions,
    init: FloatArray | None,
    split: TrainHoldout,
    baseline: dict[str, Any],
    progress: ProgressCallback | None,
    previous_score: MixtureScore | None = None,
) -> FittedMixture:
    """Fit ``estimator`` (unfitted, of ``spec``), starting also from ``init`` when given; its
    score's maximum-likelihood search also starts from ``previous_score``'s (a k sweep's
    (k - 1)-line maximum) plus one line."""
    X_train, y_train = split.X_train, split.y_train
    X_holdout, y_holdout = split.X_holdout, split.y_holdout
    n_components = int(estimator.n_components)
    params = estimator.resolved_parameters(*X_train.shape)
    # The time budget is the job's own field, not an algorithm parameter.
    params.pop("time_budget", None)
    if init is not None:
        # A k sweep's warm start; the stored parameters stay those the job asked for, and the
        # start shows among the fit's candidates (source "init").
        estimator.set_params(init=init)
    if (
        spec.standard_errors is None
        and len(y_train) <= AUTO_STANDARD_ERRORS_MAX_ROWS
        and fit_memory.information_bytes(
            n_components, X_train.shape[1], fit_intercept=spec.fit_intercept, gate_columns=None
        )
        <= fit_memory.AUTO_STANDARD_ERRORS_MAX_BYTES
    ):
        # Not told: standard errors where they cost a small share of the fit.
        estimator.set_params(standard_errors=True)
    started = time.perf_counter()
    fit_share = 0.5 if spec.n_bootstrap else 1.0
    try:
        fit_warnings = _fit_recording_warnings(
            estimator,
            X_train,
            y_train,
            _scaled_progress(progress, 0.0, fit_share),
            split.weights_train,
            split.groups_train,
            concomitant=split.Z_train,
        )
    except OverflowError:
        raise ValueError(f"the fit overflows a float64; {RESCALE_HINT}") from None
    fit_seconds = time.perf_counter() - started
    bootstrap = None
    if spec.n_bootstrap:
        bootstrap = estimator.bootstrap(
            X_train,
            y_train,
            n_bootstrap=spec.n_bootstrap,
            kind=spec.bootstrap,
            random_state=spec.seed,
            progress=_scaled_progress(progress, fit_share, 1.0 - fit_share),
        )
    coef = np.asarray(estimator.coef_, dtype=np.float64)
    intercept = np.asarray(estimator.intercept_, dtype=np.float64)
    train_min_loss = _line_min_loss(X_train, y_train, coef, intercept, split.weights_train)
    holdout_min_loss = (
        _line_min_loss(X_holdout, y_holdout, coef, intercept, split.weights_holdout)
        if len(y_holdout)
        else None
    )
    poor = _poor_fit_warning(
        spec,
        n_components,
        len(y_train),
        train_min_loss=train_min_loss,
        holdout_min_loss=holdout_min_loss,
        baseline=baseline,
    )
    candidates = getattr(estimator, "candidates_", None)
    fitted = FittedMixture(
        n_components=n_components,
        params=params,
        coef=coef,
        intercept=intercept,
        shares=np.asarray(estimator.shares_, dtype=np.float64),
        train_min_loss=train_min_loss,
        holdout_min_loss=holdout_min_loss,
        baseline=baseline,
        n_train=len(y_train),
        n_holdout=len(y_holdout),
        loss_history=[float(value) for value in np.asarray(estimator.loss_history_).ravel()],
        n_iter=int(estimator.n_iter_),
        fit_seconds=fit_seconds,
        converged=bool(estimator.converged_),
        score=mixture_score(
            X_train,
            y_train,
            coef,
            intercept,
            fit_intercept=spec.fit_intercept,
            sample_weight=split.weights_train,
            groups=split.groups_train,
            previous=previous_score,
            random_state=spec.seed,
        ),
        candidates=None if candidates is None else [_candidate(item) for item in candidates],
        warnings=[*fit_warnings, *([poor] if poor else [])],
        uncertainty=(
            uncertainty_record(estimator, bootstrap)
            if estimator.standard_errors or bootstrap is not None
            else None
        ),
        gate=None if spec.gating is None else gate_record(estimator, split, spec),
    )
    if split.groups_train is not None:
        fitted = replace(
            fitted,
            group_labels=estimator.group_labels_,
            group_lines=estimator.group_line_,
            group_posteriors=getattr(estimator, "group_posterior_", None),
            group_metrics=group_metrics(estimator, split),
        )
    check_finite_result(fitted)
    return fitted


def group_metrics(estimator: MixtureOfLinearRegressions, split: TrainHoldout) -> dict[str, Any]:
    """A grouped fit's groups and its group-level min-losses: on the training rows, each group
    on its fitted line (the grouped min-loss the fit minimized); on the holdout, whose groups
    the fit never saw, each group on the line that fits its rows best."""
    holdout = None
    if split.groups_holdout is not None and len(split.y_holdout):
        holdout = estimator.min_loss(
            split.X_holdout, split.y_holdout, split.weights_holdout, split.groups_holdout
        )
    return {
        "n_groups_train": int(estimator.group_labels_.size),
        "n_groups_holdout": (
            0 if split.groups_holdout is None else int(np.unique(split.groups_holdout).size)
        ),
        "train_group_min_loss": float(estimator.train_loss_),
        "holdout_group_min_loss": holdout,
    }


def _scaled_progress(
    progress: ProgressCallback | None, start: float, share: float
) -> ProgressCallback | None:
    """``progress`` for one phase of a fit that covers ``[start, start + share]`` of it."""
    if progress is None or (start == 0.0 and share == 1.0):
        return progress

    def report(fraction: float, info: dict[str, Any]) -> None:
        progress(start + share * fraction, info)

    return report


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing or not finite (JSON holds neither)."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


UNCERTAINTY_LEVEL = 0.95


def _estimate(row: SummaryRow, bootstrap: tuple[float, float, float] | None) -> dict[str, Any]:
    record = {
        "estimate": row.estimate,
        "std_error": row.std_error,
        "z_value": row.z_value,
        "p_value": row.p_value,
        "lower": row.lower,
        "upper": row.upper,
    }
    if bootstrap is not None:
        se, lower, upper = (finite_or_none(value) for value in bootstrap)
        record |= {"bootstrap_std_error": se, "bootstrap_lower": lower, "bootstrap_upper": upper}
    return record


def _bootstrap_of(
    bootstrap: BootstrapResult | None, name: str, line: int, column: int | None
) -> tuple[float, float, float] | None:
    """The bootstrap's standard error and percentile interval of one parameter of a line."""
    if bootstrap is None:
        return None
    se = getattr(bootstrap, f"{name}_se")[line]
    interval = getattr(bootstrap, f"{name}_interval")[line]
    if column is not None:
        se, interval = se[column], interval[column]
    return float(se), float(interval[0]), float(interval[1])


def _line_covariance(estimator: MixtureOfLinearRegressions, line: int) -> list[list[float]] | None:
    """The joint covariance of a line's coefficients then intercept (None where the standard
    errors do not exist)."""
    n_params = estimator.n_features_in_ + bool(estimator.fit_intercept)
    start = line * (n_params + 1)
    block = estimator.covariance_[start : start + n_params, start : start + n_params]
    return [[float(value) for value in row] for row in block] if np.isfinite(block).all() else None


def uncertainty_record(
    estimator: MixtureOfLinearRegressions, bootstrap: BootstrapResult | None
) -> dict[str, Any]:
    """What a model stores of its standard errors: per line, each coefficient's, the
    intercept's (None without one), the weight's and the noise variance's estimate, standard
    error, z, p and 95 % interval (None where one does not exist), with the bootstrap's
    standard error and percentile interval when one ran."""
    table = estimator.summary(level=UNCERTAINTY_LEVEL)
    n_features = estimator.n_features_in_
    per_line = n_features + bool(estimator.fit_intercept) + 2
    components = []
    for line in range(estimator.n_components):
        rows = table.rows[line * per_line : (line + 1) * per_line]

        components.append(
            {
                "coef": [
                    _estimate(rows[column], _bootstrap_of(bootstrap, "coef", line, column))
                    for column in range(n_features)
                ],
                "intercept": (
                    _estimate(rows[n_features], _bootstrap_of(bootstrap, "intercept", line, None))
                    if estimator.fit_intercept
                    else None
                ),
                "weight": _estimate(rows[-2], _bootstrap_of(bootstrap, "weights", line, None)),
                "covariance": _line_covariance(estimator, line),
                "noise_variance": _estimate(
                    rows[-1], _bootstrap_of(bootstrap, "noise_variance", line, None)
                ),
            }
        )
    gate = None
    if table.gate_rows:
        # Per free component its intercept, then one row per column the gate reads.
        per_component = len(table.gate_rows) // (estimator.n_components - 1)
        gate = [
            {
                "component": rows[0].component,
                "intercept": _estimate(rows[0], None),
                "coef": [_estimate(row, None) for row in rows[1:]],
            }
            for rows in (
                table.gate_rows[start : start + per_component]
                for start in range(0, len(table.gate_rows), per_component)
            )
        ]
    return {
        "method": "observed-information",
        "level": UNCERTAINTY_LEVEL,
        "log_likelihood": finite_or_none(table.log_likelihood),
        "gate": gate,
        "bootstrap": (
            None
            if bootstrap is None
            else {
                "kind": bootstrap.kind,
                "n_bootstrap": bootstrap.n_bootstrap,
                "n_converged": bootstrap.n_converged,
            }
        ),
        "components": components,
    }


def _candidate(record: Mapping[str, Any]) -> dict[str, Any]:
    # A candidate that diverged before its polish may score as infinite; JSON has no infinity.
    return {
        key: finite_or_none(value) if isinstance(value, float) else value
        for key, value in record.items()
    }


RESCALE_HINT = "scale X and y to moderate magnitudes (say between 1e-100 and 1e100)"


def check_finite_result(fitted: FittedMixture) -> None:
    """Raise ``ValueError`` naming the first result that is NaN or infinite (JSON has neither)."""
    baseline = fitted.baseline
    results: list[tuple[str, Any]] = [
        ("coefficients", fitted.coef),
        ("intercepts", fitted.intercept),
        ("shares", fitted.shares),
        ("training min-loss", fitted.train_min_loss),
        ("holdout min-loss", fitted.holdout_min_loss),
        ("loss history", fitted.loss_history),
        ("baseline coefficients", baseline["coef"]),
        ("baseline intercept", baseline["intercept"]),
        ("baseline training min-loss", baseline["train_min_loss"]),
        ("baseline holdout min-loss", baseline["holdout_min_loss"]),
        ("log-likelihood", fitted.score.log_likelihood),
        ("BIC", fitted.score.bic),
    ]
    if fitted.gate is not None:
        gate = fitted.gate
        results += [
            ("gate coefficients", gate["coef"]),
            ("gate intercepts", gate["intercept"]),
            ("noise variances", gate["noise_variance"]),
            ("gated log-likelihood", gate["log_likelihood"]),
            ("gated holdout metrics", list((gate["holdout"] or {}).values())),
        ]
    for what, values in results:
        if values is not None and not np.all(np.isfinite(np.asarray(values, dtype=np.float64))):
            raise ValueError(f"the fit produced non-finite numbers ({what}); {RESCALE_HINT}")


def sweep_record(fitted: FittedSweep, model_ids: Mapping[int, str]) -> dict[str, Any]:
    """What a k sweep's job records: the preferred k, and per k its model and scores."""
    return {
        "best_n_components": fitted.best_n_components,
        "models": [
            {
                "n_components": fit.n_components,
                "model_id": model_ids[fit.n_components],
                "train_min_loss": fit.train_min_loss,
                "holdout_min_loss": fit.holdout_min_loss,
                "log_likelihood": fit.score.log_likelihood,
                "bic": fit.score.bic,
                "n_parameters": fit.score.n_parameters,
                "beats_baseline": fit.beats_baseline,
            }
            for fit in fitted.fits
        ],
    }
