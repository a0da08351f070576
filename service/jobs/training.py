"""The one fit path: ``run_job`` loads a claimed job, fits it and stores the model.

It runs in a child process of whichever worker claimed the job. The child heartbeats, writes
throttled progress, and stops when the job's cancellation is requested or the job is taken
away from it. Fitting and the one-line least-squares baseline share the holdout split, which
is derived from the job's seed alone, so a model can be reproduced from its record.

A k sweep fits every k on that same split with the same seed, one after the other (with
``auto``, each k also starts from the (k - 1)-line fit plus one line, as
:func:`mixreg.select_n_components` does: :func:`mixreg.sweep_warm_start`), and stores
all its models together when the last one is done: a sweep that is cancelled or fails stores
none. Warnings of the fit (``ConvergenceWarning`` and ``mixreg``'s own) and a holdout min-loss
above the baseline's are recorded on the model and the job, which still succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

import mixreg
from mixreg import (
    BootstrapResult,
    MixtureOfLinearRegressions,
    MixtureScore,
    SummaryRow,
    likelihood_drops,
    min_loss,
    mixture_score,
    predict_lines,
    preferred_n_components,
    sweep_warm_start,
)
from models_store import registry, repository
from models_store.session import make_engine, make_sessionmaker, read_scope, session_scope
from models_store.tables import TERMINAL_JOB_STATUSES, Dataset, Job
from service.config import (
    DEFAULT_KEYED_GLOBAL_ROWS,
    DEFAULT_MAX_KEY_CHARS,
    DEFAULT_MAX_KEYED_COEFFICIENTS,
)
from service.data.columns import load_columns
from service.errors import InvalidInputError
from service.jobs import fit_memory
from service.jobs.fit_columns import (
    GROUPS,
    WEIGHTS,
    check_concomitant_values,
    check_integer_keys,
    check_values,
    wanted_columns,
)
from service.logs import LogFormat, configure_logging, job_context
from service.schemas import AUTO_STANDARD_ERRORS_MAX_ROWS

FloatArray = NDArray[np.float64]
IndexArray = NDArray[np.intp]
ProgressCallback = Callable[[float, dict[str, Any]], None]

# Exit status of a fit process that stops because the process that started it is gone.
EXIT_PARENT_LOST = 75
# Exit status of a fit process that stops because its attempt at the job is no longer the current
# one (the reaper took the job away; it may run again elsewhere).
EXIT_ATTEMPT_SUPERSEDED = 76

logger = logging.getLogger(__name__)


def holdout_size(n_rows: int, holdout_fraction: float) -> int:
    """Rows held out: ``holdout_fraction * n_rows`` rounded to the nearest integer."""
    return round(holdout_fraction * n_rows)


def holdout_split(
    n_rows: int, holdout_fraction: float, seed: int, groups: NDArray[Any] | None = None
) -> tuple[IndexArray, IndexArray]:
    """Training and holdout row indices, each in increasing order.

    The holdout is the first ``holdout_size`` entries of
    ``numpy.random.default_rng(seed).permutation(n_rows)``; every other row trains.

    With ``groups`` (a label per row) a group is all training or all holdout: the groups are
    taken in the order of ``default_rng(seed).permutation(n_groups)`` while their rows do not
    pass ``holdout_size`` (the first group at least, when the holdout is not empty); one group
    at least always trains.
    """
    n_holdout = holdout_size(n_rows, holdout_fraction)
    if groups is None:
        permutation = np.random.default_rng(seed).permutation(n_rows)
        return np.sort(permutation[n_holdout:]), np.sort(permutation[:n_holdout])
    _, codes = np.unique(groups, return_inverse=True)
    codes = codes.ravel()
    n_groups = int(codes.max()) + 1 if codes.size else 0
    order = np.random.default_rng(seed).permutation(n_groups)
    taken = np.cumsum(np.bincount(codes, minlength=n_groups)[order]) <= n_holdout
    if n_holdout > 0 and n_groups > 1:
        taken[0] = True
    taken[-1] = False
    held = np.zeros(n_groups, dtype=bool)
    held[order[taken]] = True
    in_holdout = held[codes]
    return np.flatnonzero(~in_holdout), np.flatnonzero(in_holdout)


@dataclass(frozen=True)
class TrainHoldout:
    """A dataset split into its training rows and its holdout rows, each in row order, with
    the rows' weights and group labels when the fit uses them."""

    X_train: FloatArray
    y_train: FloatArray
    X_holdout: FloatArray
    y_holdout: FloatArray
    weights_train: FloatArray | None = None
    weights_holdout: FloatArray | None = None
    groups_train: NDArray[Any] | None = None
    groups_holdout: NDArray[Any] | None = None
    Z_train: FloatArray | None = None
    """The gate's concomitant columns of the training rows, when it reads extra columns."""
    Z_holdout: FloatArray | None = None

    def with_concomitant(self, Z: FloatArray, spec: FitSpec) -> TrainHoldout:
        """The same split with the concomitant columns ``Z`` (all rows, in row order) split
        alike."""
        train, holdout = holdout_split(Z.shape[0], spec.holdout_fraction, spec.seed)
        return replace(self, Z_train=Z[train], Z_holdout=Z[holdout])

    @property
    def n_features(self) -> int:
        """Columns of X."""
        return int(self.X_train.shape[1])

    @classmethod
    def of_arrays(
        cls,
        X: FloatArray,
        y: FloatArray,
        spec: FitSpec,
        *,
        weights: FloatArray | None = None,
        groups: NDArray[Any] | None = None,
    ) -> TrainHoldout:
        """Split ``X`` and ``y`` (and the rows' weights and groups) as ``spec`` says
        (``holdout_split``, groups kept whole)."""
        train, holdout = holdout_split(X.shape[0], spec.holdout_fraction, spec.seed, groups)
        return cls(X[train], y[train], X[holdout], y[holdout]).with_columns(
            train, holdout, weights=weights, groups=groups
        )

    def with_columns(
        self,
        train: IndexArray,
        holdout: IndexArray,
        *,
        weights: FloatArray | None,
        groups: NDArray[Any] | None,
    ) -> TrainHoldout:
        """This split with the weights and group labels of its rows."""
        return replace(
            self,
            weights_train=None if weights is None else weights[train],
            weights_holdout=None if weights is None else weights[holdout],
            groups_train=None if groups is None else groups[train],
            groups_holdout=None if groups is None else groups[holdout],
        )

    @classmethod
    def of_blocks(
        cls,
        blocks: Iterable[tuple[FloatArray, FloatArray]],
        *,
        n_rows: int,
        n_features: int,
        spec: FitSpec,
        weights: FloatArray | None = None,
        groups: NDArray[Any] | None = None,
    ) -> TrainHoldout:
        """Split a dataset read as consecutive blocks of rows, copying each block's rows
        straight to their side: the whole matrix is never held besides its split."""
        train_rows, holdout = holdout_split(n_rows, spec.holdout_fraction, spec.seed, groups)
        in_holdout = np.zeros(n_rows, dtype=bool)
        in_holdout[holdout] = True
        n_holdout = len(holdout)
        split = cls(
            X_train=np.empty((n_rows - n_holdout, n_features), dtype=np.float64),
            y_train=np.empty(n_rows - n_holdout, dtype=np.float64),
            X_holdout=np.empty((n_holdout, n_features), dtype=np.float64),
            y_holdout=np.empty(n_holdout, dtype=np.float64),
        )
        start = train_at = holdout_at = 0
        for X_block, y_block in blocks:
            held = in_holdout[start : start + len(y_block)]
            kept = ~held
            n_held, n_kept = int(held.sum()), len(y_block) - int(held.sum())
            split.X_train[train_at : train_at + n_kept] = X_block[kept]
            split.y_train[train_at : train_at + n_kept] = y_block[kept]
            split.X_holdout[holdout_at : holdout_at + n_held] = X_block[held]
            split.y_holdout[holdout_at : holdout_at + n_held] = y_block[held]
            start, train_at, holdout_at = (
                start + len(y_block),
                train_at + n_kept,
                holdout_at + n_held,
            )
        if start != n_rows:
            raise ValueError(f"the dataset has {n_rows} rows but {start} were read")
        return split.with_columns(train_rows, holdout, weights=weights, groups=groups)


def gating_of(gating: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    """A fit's gating as a spec holds it: None, ``"features"`` or a tuple of column names."""
    return gating if gating is None or isinstance(gating, str) else tuple(gating)


@dataclass(frozen=True)
class FitSpec:
    """Everything a fit needs besides the data; mirrors a job's columns.

    ``k_values`` makes it a k sweep (one fit per k); ``n_components`` is then the largest k.
    """

    algorithm: str
    n_components: int
    params: Mapping[str, Any]
    fit_intercept: bool
    holdout_fraction: float
    seed: int
    time_budget_s: float | None
    k_values: tuple[int, ...] | None = None
    weights_column: str | None = None
    """The dataset column of the rows' weights."""
    groups_column: str | None = None
    """The dataset column of the rows' group labels."""
    standard_errors: bool | None = False
    """Whether the fit computes standard errors; None: when the training rows number at most
    ``AUTO_STANDARD_ERRORS_MAX_ROWS``."""
    n_bootstrap: int = 0
    bootstrap: str = "parametric"

    @property
    def uncertainty(self) -> dict[str, Any]:
        """The standard errors and bootstrap asked for, as a job stores them."""
        return {
            "standard_errors": self.standard_errors,
            "n_bootstrap": self.n_bootstrap,
            "bootstrap": self.bootstrap,
        }

    gating: str | tuple[str, ...] | None = None
    """None (no gate), ``"features"``, or the dataset's extra columns the gate reads."""

    @property
    def all_n_components(self) -> tuple[int, ...]:
        """Every k to fit, in increasing order."""
        return self.k_values or (self.n_components,)

    @classmethod
    def of_job(cls, job: Job) -> FitSpec:
        """The spec stored on ``job`` (jobs stored before revision 0011 computed no standard
        errors)."""
        uncertainty = job.uncertainty or {}
        return cls(
            algorithm=job.algorithm,
            n_components=job.n_components,
            params=dict(job.params),
            fit_intercept=job.fit_intercept,
            holdout_fraction=job.holdout_fraction,
            seed=job.seed if job.seed is not None else 0,
            time_budget_s=job.time_budget_s,
            k_values=None if job.k_values is None else tuple(job.k_values),
            weights_column=job.weights_column,
            groups_column=job.groups_column,
            standard_errors=uncertainty.get("standard_errors", False),
            n_bootstrap=int(uncertainty.get("n_bootstrap", 0)),
            bootstrap=str(uncertainty.get("bootstrap", "parametric")),
            gating=gating_of(job.gating),
        )

    @property
    def concomitant_names(self) -> list[str] | None:
        """The extra columns the gate reads (None without a gate or when it reads the
        features)."""
        return None if self.gating is None or isinstance(self.gating, str) else list(self.gating)

    def estimator(self, n_components: int | None = None) -> MixtureOfLinearRegressions:
        """The unfitted estimator this spec describes (for ``n_components`` lines if given)."""
        return MixtureOfLinearRegressions(
            n_components=self.n_components if n_components is None else n_components,
            algorithm=self.algorithm,
            fit_intercept=self.fit_intercept,
            random_state=self.seed,
            time_budget=self.time_budget_s,
            # The bootstrap refits from the maximum-likelihood fit the standard errors find.
            standard_errors=bool(self.standard_errors) or self.n_bootstrap > 0,
            gating=self.gating is not None,
            **self.params,
        )


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


# Min-losses this close (relative) tie: a single line fitted two ways (k = 1) neither beats the
# least-squares baseline nor trails it.
BASELINE_TIE_RTOL = 1e-9


def baseline_comparison(
    *, train_min_loss: float, holdout_min_loss: float | None, baseline: Mapping[str, Any]
) -> tuple[str, float, float]:
    """The rows a model is judged on against the baseline, its min-loss and the baseline's:
    the holdout rows, or the training rows when nothing is held out."""
    baseline_holdout = baseline.get("holdout_min_loss")
    if holdout_min_loss is not None and baseline_holdout is not None:
        return "holdout", holdout_min_loss, float(baseline_holdout)
    return "training", train_min_loss, float(baseline["train_min_loss"])


def beats_baseline(
    *, train_min_loss: float, holdout_min_loss: float | None, baseline: Mapping[str, Any]
) -> bool:
    """True if the model's holdout min-loss (training min-loss without a holdout) is below the
    one-line least-squares baseline's by more than a rounding difference."""
    _, loss, reference = baseline_comparison(
        train_min_loss=train_min_loss, holdout_min_loss=holdout_min_loss, baseline=baseline
    )
    return loss < reference - BASELINE_TIE_RTOL * abs(reference)


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
    starts from the (k - 1)-line fit plus one line (:func:`mixreg.sweep_warm_start`). Ties in
    BIC go to the smaller k. Raises ``ValueError`` like :func:`fit_mixture`.
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
        se, lower, upper = (_finite_or_none(value) for value in bootstrap)
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
        "log_likelihood": _finite_or_none(table.log_likelihood),
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
        key: _finite_or_none(value) if isinstance(value, float) else value
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


class FitCancelledError(Exception):
    """Cancellation of the job was requested while it was fitting."""


class JobLostError(Exception):
    """The job is no longer owned by this worker (requeued, failed or cancelled meanwhile)."""


def _finite_or_none(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class JobProgress:
    """The progress callback of one job: throttled writes that also check for cancellation."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        attempt: int | None,
        interval_s: float,
    ) -> None:
        self._session_factory = session_factory
        self._job_id = job_id
        self._worker_id = worker_id
        self._attempt = attempt
        self._interval_s = interval_s
        self._last_write: float | None = None

    def __call__(self, fraction: float, info: dict[str, Any]) -> None:
        """Record progress at most every ``interval_s``; raise to abort the fit if needed."""
        now = time.monotonic()
        if self._last_write is not None and now - self._last_write < self._interval_s:
            return
        self._last_write = now
        with session_scope(self._session_factory) as session:
            owned = repository.update_progress(
                session,
                job_id=self._job_id,
                worker_id=self._worker_id,
                attempt=self._attempt,
                fraction=min(max(float(fraction), 0.0), 1.0),
                iteration=info.get("iteration"),
                candidates=info.get("candidates_tried"),
                best_loss=_finite_or_none(info.get("best_loss")),
                n_components=info.get("n_components"),
                keys_done=info.get("keys_done"),
                n_keys=info.get("n_keys"),
                now=repository.database_now(session),
            )
            job = repository.get_job(session, job_id=self._job_id)
            cancel_requested = job is not None and job.cancel_requested
        if not owned:
            raise JobLostError(self._job_id)
        if cancel_requested:
            raise FitCancelledError(self._job_id)


class Heartbeat:
    """A daemon thread that marks the job alive, from the start of the fit process (before the
    data are loaded), and ends the process if its worker is gone or its attempt superseded.

    ``worker_alive`` is the read end of a pipe whose write end only the worker holds: it
    becomes readable (end of file) when the worker process dies. Without this check a fit
    would outlive a killed server, keep the job's heartbeat fresh and so keep the job from
    being retried. A beat that finds the job no longer running attempt ``attempt`` for this
    worker (the reaper requeued it, another attempt runs it, it was cancelled) ends the
    process at once: its work could never be stored, and it would hold memory and a slot.
    The thread is stopped before the fit's final write, so that write is never mistaken for a
    loss.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        attempt: int | None,
        interval_s: float,
        worker_alive: Connection | None,
    ) -> None:
        self._session_factory = session_factory
        self._job_id = job_id
        self._worker_id = worker_id
        self._attempt = attempt
        self._interval_s = interval_s
        self._worker_alive = worker_alive
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mixreg-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop beating (idempotent); returns once the thread has ended."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def exit_if_worker_gone(self) -> None:
        """End the process at once if its worker is gone (checked before the final write too:
        the beat runs once a second, and a fit its worker no longer runs must not finish the
        job on an attempt the reaper is about to retry)."""
        if self._worker_alive is not None and self._worker_alive.poll():
            logger.error("job %s: the worker process is gone; stopping the fit", self._job_id)
            os._exit(EXIT_PARENT_LOST)

    def _run(self) -> None:
        while True:
            self.exit_if_worker_gone()
            try:
                with session_scope(self._session_factory) as session:
                    owned = repository.heartbeat(
                        session,
                        job_id=self._job_id,
                        worker_id=self._worker_id,
                        attempt=self._attempt,
                        now=repository.database_now(session),
                    )
            except SQLAlchemyError:
                logger.exception("job %s: heartbeat failed; retrying", self._job_id)
            else:
                if not owned and not self._stopped.is_set():
                    logger.warning(
                        "job %s: attempt %s is no longer current; stopping the fit process",
                        self._job_id,
                        self._attempt,
                    )
                    os._exit(EXIT_ATTEMPT_SUPERSEDED)
            if self._stopped.wait(self._interval_s):
                return


def run_job(
    job_id: str,
    database_url: str,
    *,
    heartbeat_interval_s: float = 1.0,
    progress_interval_s: float = 0.5,
    worker_id: str | None = None,
    attempt: int | None = None,
    worker_alive: Connection | None = None,
    data_loaded: EventType | None = None,
    log_format: LogFormat | None = None,
    stale_after_s: float = 15.0,
    keyed_global_rows: int = DEFAULT_KEYED_GLOBAL_ROWS,
    max_key_chars: int = DEFAULT_MAX_KEY_CHARS,
    max_keyed_coefficients: int = DEFAULT_MAX_KEYED_COEFFICIENTS,
) -> str:
    """Fit the running job ``job_id`` and store its model (a k sweep: one per k), finishing the
    job in the same unit of work.

    ``worker_id`` is the worker that claimed the job (default: whichever the job names) and
    ``attempt`` the attempt it claimed (default: the current one); a job that meanwhile went to
    another worker or attempt is left alone, and the process exits as soon as its heartbeat
    finds that out (``EXIT_ATTEMPT_SUPERSEDED``). The heartbeat starts before the data are
    loaded, so a slow load never looks like a lost worker. ``worker_alive`` is the read end of
    a pipe held open by the worker process; the fit stops when it closes. ``data_loaded`` is set
    once the data are loaded (the worker's time limit counts from then). A keyed job's shard
    claimed by a process whose heartbeat is older than ``stale_after_s`` (seconds, on the
    database's clock) is claimed again. ``log_format``, when given, configures the logging of
    this process (a fit process does not inherit its worker's); every line logged during the
    fit names ``job_id``. A keyed job's global model is fitted on at most ``keyed_global_rows``
    rows drawn at random (``MIXREG_KEYED_GLOBAL_ROWS``), and refused (failed) if a key is longer
    than ``max_key_chars`` or its keys' lines would hold more than ``max_keyed_coefficients``
    coefficients (:class:`KeyedLimits`). Returns the status the
    job was left in by this call (``"lost"`` if the job was not, or stopped being, owned by the
    worker that claimed it).
    """
    if log_format is not None:
        configure_logging(log_format)
    engine = make_engine(database_url)
    try:
        with job_context(job_id):
            return _run_job(
                make_sessionmaker(engine),
                job_id,
                heartbeat_interval_s=heartbeat_interval_s,
                progress_interval_s=progress_interval_s,
                worker_id=worker_id,
                attempt=attempt,
                worker_alive=worker_alive,
                data_loaded=data_loaded,
                stale_after_s=stale_after_s,
                keyed_global_rows=keyed_global_rows,
                keyed_limits=KeyedLimits(max_key_chars, max_keyed_coefficients),
            )
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _Attempt:
    """Who runs the job: the worker that claimed it and its attempt number."""

    worker_id: str
    attempt: int


DEFAULT_KEYS_PER_SHARD = 65_536
"""Keys a keyed job fits and stores at a time: a lost worker loses at most this many."""


@dataclass(frozen=True)
class KeyedData:
    """A keyed fit's dataset, key column and settings."""

    dataset_id: str
    split_by: str
    small_keys: str
    keys_per_shard: int

    @classmethod
    def of_job(cls, job: Job) -> KeyedData:
        """The keyed settings of ``job`` (which has a ``split_by``)."""
        assert job.split_by is not None
        return cls(
            dataset_id=job.dataset_id,
            split_by=job.split_by,
            small_keys=job.small_keys or "k1",
            keys_per_shard=job.keys_per_shard or DEFAULT_KEYS_PER_SHARD,
        )


@dataclass(frozen=True)
class KeyedLimits:
    """What a keyed job may hold: keys of at most ``max_key_chars`` characters
    (``MIXREG_MAX_KEY_CHARS``), and at most ``max_coefficients`` lines' coefficients over
    every key, n_keys x k x features (``MIXREG_MAX_KEYED_COEFFICIENTS``)."""

    max_key_chars: int = DEFAULT_MAX_KEY_CHARS
    max_coefficients: int = DEFAULT_MAX_KEYED_COEFFICIENTS

    def check_coefficients(self, n_keys: int, n_components: int, n_features: int) -> None:
        """Raise ``ValueError`` naming the product past the limit."""
        product = n_keys * n_components * n_features
        if product > self.max_coefficients:
            raise ValueError(
                f"split_by: {n_keys:,} keys x k = {n_components} x {n_features} features make "
                f"{product:,} coefficients; a keyed fit may hold at most "
                f"{self.max_coefficients:,} (MIXREG_MAX_KEYED_COEFFICIENTS): split by a column "
                f"with fewer keys, or fit fewer lines or features"
            )


def key_values(values: NDArray[Any]) -> NDArray[Any]:
    """A key column's values (a number column: float with NaN where missing; text: str, None
    where missing) with an empty text as a missing key."""
    if values.dtype == object:
        values = values.copy()
        values[values == ""] = None
    return values


def keyed_global_sample(
    n_rows: int, holdout_fraction: float, seed: int, max_rows: int
) -> tuple[IndexArray, NDArray[np.bool_]]:
    """The rows a keyed job's global model is fitted and scored on: at most ``max_rows`` rows
    drawn at random (every row if there are no more), increasing, and which of them are held
    out.

    A row is held out exactly when it is in the job's holdout over all rows
    (:func:`holdout_split` of ``n_rows``). The sample is the first rows of each side of the
    split in that split's own random order, in proportion to the sides' sizes: a uniform
    random part of each side, drawn with no second permutation of the rows.
    """
    n_holdout = holdout_size(n_rows, holdout_fraction)
    # holdout_split's draw: its first n_holdout entries are the holdout.
    permutation = np.random.default_rng(seed).permutation(n_rows)
    if n_rows <= max_rows:
        held = np.zeros(n_rows, dtype=bool)
        held[permutation[:n_holdout]] = True
        return np.arange(n_rows, dtype=np.int64), held
    n_held = round(max_rows * n_holdout / n_rows)
    rows = np.concatenate(
        (permutation[:n_held], permutation[n_holdout : n_holdout + max_rows - n_held])
    )
    del permutation
    order = np.argsort(rows)
    return rows[order], order < n_held


@dataclass(frozen=True)
class _ClaimedJob:
    worker_id: str
    attempt: int
    dataset_id: str
    name: str | None
    spec: FitSpec
    data: TrainHoldout
    feature_names: list[str]
    registered_model: str | None
    keyed: KeyedData | None = None


def _current_attempt(
    session_factory: sessionmaker[Session], job_id: str, worker_id: str | None, attempt: int | None
) -> _Attempt | None:
    """The running attempt at ``job_id``, if it is the one asked for (any, for None)."""
    with read_scope(session_factory) as session:
        job = repository.get_job(session, job_id=job_id)
        if job is None or job.status != "running" or job.worker_id is None:
            return None
        if worker_id is not None and job.worker_id != worker_id:
            return None
        if attempt is not None and job.attempts != attempt:
            return None
        return _Attempt(job.worker_id, job.attempts)


def _load_claimed_job(
    session_factory: sessionmaker[Session], job_id: str, owner: _Attempt, keyed_global_rows: int
) -> _ClaimedJob | None:
    """Read the job's spec and split its dataset (a keyed job: the rows of its global model,
    :func:`keyed_global_sample`); None if the attempt is no longer current.

    One read transaction (a snapshot, no write lock on SQLite), so the heartbeat and every
    other writer go on while the data are read.
    """
    with read_scope(session_factory) as session:
        job = repository.get_job(session, job_id=job_id)
        if job is None or (job.status, job.worker_id, job.attempts) != (
            "running",
            owner.worker_id,
            owner.attempt,
        ):
            return None
        dataset = repository.get_dataset(session, dataset_id=job.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {job.dataset_id} of job {job_id} is gone")
        spec = FitSpec.of_job(job)
        if job.split_by is not None:
            keyed = KeyedData.of_job(job)
            # A keyed fit takes neither weights, groups nor gating (service.schemas).
            rows, held = keyed_global_sample(
                dataset.n_rows, spec.holdout_fraction, spec.seed, keyed_global_rows
            )
            X, y, _ = repository.read_dataset_rows(
                session, dataset=dataset, rows=rows, column=keyed.split_by
            )
            del rows
            data = TrainHoldout(X[~held], y[~held], X[held], y[held])
            del X, y
        else:
            keyed, data = None, _load_split(session, dataset, spec)
        return _ClaimedJob(
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            dataset_id=job.dataset_id,
            name=job.name,
            spec=spec,
            data=data,
            feature_names=list(dataset.feature_names),
            registered_model=job.registered_model,
            keyed=keyed,
        )


def _load_split(session: Session, dataset: Dataset, spec: FitSpec) -> TrainHoldout:
    """Every row of ``dataset`` split by ``spec``, with the columns the fit uses."""
    wanted = wanted_columns(spec.weights_column, spec.groups_column)
    columns = load_columns(dataset, wanted)
    check_values(columns, wanted)
    data = TrainHoldout.of_blocks(
        repository.iter_dataset_blocks(session, dataset=dataset),
        n_rows=dataset.n_rows,
        n_features=dataset.n_features,
        spec=spec,
        weights=columns.get(WEIGHTS),
        groups=columns.get(GROUPS),
    )
    if spec.concomitant_names is None:
        return data
    gate_columns = repository.load_dataset_columns(dataset, spec.concomitant_names)
    Z = np.column_stack([gate_columns[name] for name in spec.concomitant_names])
    check_concomitant_values(Z, spec.concomitant_names)
    return data.with_concomitant(Z, spec)


def _run_job(
    session_factory: sessionmaker[Session],
    job_id: str,
    *,
    heartbeat_interval_s: float,
    progress_interval_s: float,
    worker_id: str | None,
    attempt: int | None,
    worker_alive: Connection | None,
    data_loaded: EventType | None,
    stale_after_s: float,
    keyed_global_rows: int,
    keyed_limits: KeyedLimits,
) -> str:
    owner = _current_attempt(session_factory, job_id, worker_id, attempt)
    if owner is None:
        return "lost"
    heartbeat = Heartbeat(
        session_factory,
        job_id=job_id,
        worker_id=owner.worker_id,
        attempt=owner.attempt,
        interval_s=heartbeat_interval_s,
        worker_alive=worker_alive,
    )
    with heartbeat:
        try:
            claimed = _load_claimed_job(session_factory, job_id, owner, keyed_global_rows)
        except InvalidInputError as exc:
            heartbeat.stop()
            return _finish_unfitted(session_factory, job_id, owner, "failed", exc.detail)
        if claimed is None:
            return "lost"
        if data_loaded is not None:
            data_loaded.set()
        progress = JobProgress(
            session_factory,
            job_id=job_id,
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            interval_s=progress_interval_s,
        )
        error: str | None = None
        spec, data = claimed.spec, claimed.data
        logger.info(
            "fitting %s with k=%s on %d training rows of %d features in process %d",
            spec.algorithm,
            ",".join(map(str, spec.all_n_components)),
            len(data.y_train),
            data.n_features,
            os.getpid(),
        )
        try:
            if (keyed_data := claimed.keyed) is None:
                fitted, keyed = fit_split(data, spec, progress=progress), None
            else:
                with ShardStore(
                    session_factory,
                    job_id=job_id,
                    worker_id=owner.worker_id,
                    stale_after_s=stale_after_s,
                    heartbeat_interval_s=heartbeat_interval_s,
                    worker_alive=worker_alive,
                ) as shards:
                    fitted, keyed = fit_keyed(
                        data,
                        keyed_data,
                        spec,
                        shards,
                        read_keys=lambda: _key_blocks(session_factory, keyed_data),
                        read_rows=lambda rows: _read_keyed_rows(session_factory, keyed_data, rows),
                        wait_s=progress_interval_s or heartbeat_interval_s,
                        progress=progress,
                        limits=keyed_limits,
                    )
        except JobLostError:
            return "lost"
        except FitCancelledError:
            status = "cancelled"
        except InvalidInputError as exc:
            status, error = "failed", exc.detail
        except ValueError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:
            logger.exception("job %s: the fit raised", job_id)
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            heartbeat.stop()
            heartbeat.exit_if_worker_gone()
            try:
                _store_models(session_factory, job_id, claimed, fitted, keyed)
            except JobLostError:
                return "lost"
            return "succeeded"
        heartbeat.stop()
        return _finish_unfitted(session_factory, job_id, owner, status, error)


def _finish_unfitted(
    session_factory: sessionmaker[Session],
    job_id: str,
    owner: _Attempt,
    status: str,
    error: str | None,
) -> str:
    """End the job of attempt ``owner`` without a model (``failed`` with ``error``, or
    ``cancelled``); return its status, or ``lost`` if the attempt is no longer current."""
    with session_scope(session_factory) as session:
        finished = repository.finish_job(
            session,
            job_id=job_id,
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            status=status,
            error=error,
            now=repository.database_now(session),
        )
        if finished:
            repository.discard_job_data(session, job_id=job_id)
    return status if finished else "lost"


def _store_models(
    session_factory: sessionmaker[Session],
    job_id: str,
    claimed: _ClaimedJob,
    fitted: FittedSweep,
    keyed: dict[str, Any] | None = None,
) -> None:
    """Store the model of every k (of a keyed fit: the global model and every key's lines in
    chunks) and finish the job together; roll all back if the job was taken away."""
    spec = claimed.spec
    with session_scope(session_factory) as session:
        model_ids: dict[int, str] = {}
        for fit in fitted.fits:
            model_ids[fit.n_components] = repository.create_model(
                session,
                job_id=job_id,
                dataset_id=claimed.dataset_id,
                name=claimed.name,
                algorithm=spec.algorithm,
                n_components=fit.n_components,
                n_features=claimed.data.n_features,
                feature_names=claimed.feature_names,
                fit_intercept=spec.fit_intercept,
                params=fit.params,
                seed=spec.seed,
                coef=fit.coef,
                intercept=fit.intercept,
                shares=fit.shares,
                train_min_loss=fit.train_min_loss,
                holdout_min_loss=fit.holdout_min_loss,
                baseline=fit.baseline,
                n_train=fit.n_train,
                n_holdout=fit.n_holdout,
                loss_history=fit.loss_history,
                n_iter=fit.n_iter,
                fit_seconds=fit.fit_seconds,
                converged=fit.converged,
                log_likelihood=fit.score.log_likelihood,
                bic=fit.score.bic,
                n_parameters=fit.score.n_parameters,
                candidates=fit.candidates,
                warnings=fit.warnings,
                weights_column=spec.weights_column,
                groups_column=spec.groups_column,
                group_labels=fit.group_labels,
                group_lines=fit.group_lines,
                group_posteriors=fit.group_posteriors,
                group_metrics=fit.group_metrics,
                uncertainty=fit.uncertainty,
                gate=fit.gate,
                split_by=None if claimed.keyed is None else claimed.keyed.split_by,
                keyed_summary=keyed,
            ).id
        if keyed is not None:
            repository.publish_job_shards(
                session, job_id=job_id, model_id=model_ids[spec.n_components]
            )
            repository.record_keyed_summary(session, job_id=job_id, summary=keyed)
        if spec.k_values is None:
            sweep, job_warnings = None, fitted.best.warnings
        else:
            sweep = sweep_record(fitted, model_ids)
            job_warnings = [
                f"k={fit.n_components}: {warning}"
                for fit in fitted.fits
                for warning in fit.warnings
            ]
        if claimed.registered_model is not None:
            registry.create_version(
                session,
                name=claimed.registered_model,
                model_id=model_ids[fitted.best_n_components],
            )
        if not repository.finish_job(
            session,
            job_id=job_id,
            worker_id=claimed.worker_id,
            attempt=claimed.attempt,
            status="succeeded",
            model_id=model_ids[fitted.best_n_components],
            sweep=sweep,
            warnings=job_warnings,
            best_loss=fitted.best.train_min_loss,
            now=repository.database_now(session),
        ):
            raise JobLostError(job_id)
        repository.discard_job_data(session, job_id=job_id)


class ShardStore:
    """A keyed job's shards seen by one claimant (a process of a worker): its plan, claims,
    stored shards and the progress of all of them.

    Used as a context manager: a daemon thread renews the heartbeat of the claimant's shard
    on the database's clock every ``heartbeat_interval_s`` (with the keys it has fitted of
    it), notes when the job ended or is being cancelled (:meth:`fitting` then raises
    :class:`FitCancelledError`), and ends the process if ``worker_alive`` (the read end of a
    pipe its worker holds) closes. A claim whose heartbeat is older than ``stale_after_s`` is
    free again, so a shard of a claimant that died is fitted by another.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        stale_after_s: float,
        heartbeat_interval_s: float,
        worker_alive: Connection | None = None,
    ) -> None:
        self._session_factory = session_factory
        self._job_id, self.worker_id = job_id, worker_id
        # One claimant per process: its claims go stale together when it dies.
        self.claimant = f"{worker_id}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._stale_after_s = stale_after_s
        self._interval_s = heartbeat_interval_s
        self._worker_alive = worker_alive
        self._keys_fitting = 0
        self._job_ended = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="mixreg-shards", daemon=True)

    def __enter__(self) -> ShardStore:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _exit_if_worker_gone(self) -> None:
        if self._worker_alive is not None and self._worker_alive.poll():
            logger.error("job %s: the worker process is gone; stopping", self._job_id)
            os._exit(EXIT_PARENT_LOST)

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._exit_if_worker_gone()
            try:
                with session_scope(self._session_factory) as session:
                    unfinished = repository.beat_job_shards(
                        session,
                        job_id=self._job_id,
                        claimant=self.claimant,
                        now=repository.database_now(session),
                        keys_done=self._keys_fitting,
                    )
            except SQLAlchemyError:
                logger.exception("job %s: shard heartbeat failed; retrying", self._job_id)
            else:
                if not unfinished:
                    self._job_ended.set()

    def plan(self, shards: Sequence[tuple[int, IndexArray]]) -> None:
        """Record the job's shards (keys, rows per shard) unless an earlier attempt did."""
        with session_scope(self._session_factory) as session:
            repository.plan_job_shards(session, job_id=self._job_id, shards=shards)

    def claim(self) -> repository.ShardClaim | None:
        """Claim a free (or stale) shard of the job; None if there is none."""
        with session_scope(self._session_factory) as session:
            now = repository.database_now(session)
            claim = repository.claim_job_shard(
                session,
                job_id=self._job_id,
                claimant=self.claimant,
                now=now,
                stale_before=now - timedelta(seconds=self._stale_after_s),
            )
        self._keys_fitting = 0
        if claim is not None:
            logger.info(
                "job %s: shard %d (%d keys, %d rows) claimed by %s",
                self._job_id,
                claim.position,
                claim.n_keys,
                claim.rows.size,
                self.claimant,
            )
        return claim

    def fitting(self, keys_done: int) -> None:
        """Note the keys fitted of the claimed shard; raise :class:`FitCancelledError` once
        the job is finished or being cancelled (its shards' work is then lost anyway)."""
        self._keys_fitting = keys_done
        if self._job_ended.is_set():
            raise FitCancelledError(self._job_id)

    def store(self, position: int, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Store the fitted shard ``position``; False (nothing stored) if this claimant no
        longer holds it or the job ended. A process whose worker is gone ends here instead:
        the heartbeat notices only at its next beat, and the shards a lost attempt stores
        after its worker died would be credited to an attempt nobody runs any more."""
        self._exit_if_worker_gone()
        with session_scope(self._session_factory) as session:
            stored = repository.store_job_shard(
                session,
                job_id=self._job_id,
                position=position,
                claimant=self.claimant,
                worker_id=self.worker_id,
                arrays=arrays,
            )
        if not stored:
            logger.warning(
                "job %s: shard %d was not stored: its claim went to another worker or the "
                "job ended",
                self._job_id,
                position,
            )
        return stored

    def counts(self) -> repository.ShardCounts:
        """The shards done and free, and the keys done over every claimant."""
        with read_scope(self._session_factory) as session:
            return repository.job_shard_counts(session, job_id=self._job_id)

    def load(self) -> dict[str, NDArray[Any]]:
        """Every stored shard, joined in key order."""
        with read_scope(self._session_factory) as session:
            return repository.load_job_shards(session, job_id=self._job_id)


@dataclass(frozen=True)
class ShardPlan:
    """A keyed job's distinct keys (sorted), per shard of ``keys_per_shard`` consecutive ones
    its key count and the rows of its keys (increasing), and the rows without a key."""

    distinct: NDArray[Any]
    shards: list[tuple[int, IndexArray]]
    rows_without_key: int


def plan_shards(
    read_keys: Callable[[], Iterable[NDArray[Any]]],
    keys_per_shard: int,
    *,
    max_key_chars: int | None = None,
    column: str = "keys",
) -> ShardPlan:
    """Plan a keyed job's shards from its key column, read twice block by block (consecutive
    blocks of rows in row order, as :func:`key_values` gives them) by ``read_keys``: the
    distinct keys first, then each block's rows to their shard.

    Memory holds the distinct keys, one block and the plan's row indices, never the whole
    column: a row's shard is the position of its key among the sorted distinct keys, divided
    by ``keys_per_shard``. A text key longer than ``max_key_chars`` raises ``ValueError``
    naming the key ``column`` and its row.
    """
    distinct_parts: list[NDArray[Any]] = []
    rows_without_key = 0
    start = 0
    # Closed at once when a key is refused: the reader holds a database cursor.
    with _closing_blocks(read_keys()) as blocks:
        for block in blocks:
            missing = mixreg.missing_keys(block)
            rows_without_key += int(missing.sum())
            distinct_parts.append(np.unique(mixreg.key_array(block[~missing])))
            if max_key_chars is not None:
                _check_key_lengths(distinct_parts[-1], block, start, max_key_chars, column)
            start += block.shape[0]
    distinct = (
        np.unique(np.concatenate(distinct_parts)) if distinct_parts else np.zeros(0, np.float64)
    )
    del distinct_parts
    n_shards = -(-distinct.size // keys_per_shard)
    rows_of: list[list[IndexArray]] = [[] for _ in range(n_shards)]
    start = 0
    for block in read_keys():
        present = np.flatnonzero(~mixreg.missing_keys(block))
        shard_of_row = np.searchsorted(distinct, mixreg.key_array(block[present])) // keys_per_shard
        # A stable sort keeps each shard's rows increasing, and blocks come in row order.
        order = np.argsort(shard_of_row, kind="stable")
        bounds = np.searchsorted(shard_of_row[order], np.arange(n_shards + 1))
        for shard in np.flatnonzero(np.diff(bounds)):
            rows_of[shard].append(start + present[order[bounds[shard] : bounds[shard + 1]]])
        start += block.shape[0]
    shards: list[tuple[int, IndexArray]] = []
    for position in range(n_shards):
        # Joined shard by shard, each block's part let go: the row indices are held once.
        parts, rows_of[position] = rows_of[position], []
        shards.append(
            (
                min(keys_per_shard, distinct.size - position * keys_per_shard),
                np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64),
            )
        )
        del parts
    return ShardPlan(distinct=distinct, shards=shards, rows_without_key=rows_without_key)


@contextmanager
def _closing_blocks(items: Iterable[NDArray[Any]]) -> Iterator[Iterator[NDArray[Any]]]:
    """An iterator over ``items`` that is closed on leaving (a generator's ``finally`` and
    ``with`` blocks run then, not when it is garbage-collected)."""
    iterator = iter(items)
    try:
        yield iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _check_key_lengths(
    distinct: NDArray[Any], block: NDArray[Any], start: int, max_key_chars: int, column: str
) -> None:
    """Raise naming the first row of ``block`` (whose first row is ``start``) holding a text
    key of ``distinct`` (the block's keys) longer than ``max_key_chars``: every key is
    stored, cached and looked up by each process that serves the model."""
    if distinct.dtype != object or distinct.size == 0:
        return
    lengths = np.fromiter(map(len, distinct), dtype=np.int64, count=distinct.size)
    if int(lengths.max()) <= max_key_chars:
        return
    longest = distinct[int(np.flatnonzero(lengths > max_key_chars)[0])]
    row = start + int(np.flatnonzero(block == longest)[0])
    raise ValueError(
        f"split_by: column '{column}' holds a key of {len(longest):,} characters in row {row} "
        f"(counted from 0); a key may hold at most {max_key_chars:,} (MIXREG_MAX_KEY_CHARS)"
    )


def fit_shard(
    X: FloatArray,
    y: FloatArray,
    keys: NDArray[Any],
    position: int,
    spec: FitSpec,
    small_keys: str,
    progress: Callable[[int], None],
) -> dict[str, NDArray[Any]]:
    """Fit a mixture per key on the rows of shard ``position`` (in row order) and return the
    arrays stored for it (text keys as Python strings, stored as UTF-8: never pickled). The
    shard draws from its own seed (the job's seed and its position), so it fits the same
    whichever worker and attempt fit it. ``progress`` gets the keys fitted so far, between
    batches of keys."""
    fitted = mixreg.fit_per_key(
        X,
        y,
        keys,
        spec.n_components,
        fit_intercept=spec.fit_intercept,
        small_keys="skip" if small_keys == "skip" else "k1",
        global_model=False,
        random_state=np.random.default_rng([spec.seed, position]),
        progress=lambda keys_done, _: progress(keys_done),
    )
    return {
        # Text keys stay Python strings: the store keeps them as UTF-8 bytes and offsets,
        # never at the width of the longest.
        "keys": fitted.keys if fitted.keys.dtype.kind in "iu" else fitted.keys.astype(object),
        "coef": fitted.coef,
        "intercept": fitted.intercept,
        "shares": fitted.shares,
        "min_loss": fitted.min_loss,
        "n_rows": fitted.n_rows,
        "status": fitted.status,
    }


ReadRows = Callable[[IndexArray], tuple[FloatArray, FloatArray, NDArray[Any]]]
"""Reads rows of a keyed job's dataset (increasing indices): their X, y and keys."""


def fit_keyed(
    split: TrainHoldout,
    keyed: KeyedData,
    spec: FitSpec,
    shards: ShardStore,
    *,
    read_keys: Callable[[], Iterable[NDArray[Any]]],
    read_rows: ReadRows,
    wait_s: float,
    progress: ProgressCallback | None = None,
    limits: KeyedLimits = KeyedLimits(),
) -> tuple[FittedSweep, dict[str, Any]]:
    """A keyed fit: the shards planned from the key column (``read_keys``,
    :func:`plan_shards`), the global model of the job's spec on ``split`` (its sample of rows,
    :func:`keyed_global_sample`; a tenth of the progress), then a mixture per key on all rows
    (:func:`mixreg.fit_per_key`), in shards of ``keys_per_shard`` consecutive keys. Progress
    moves through each part in proportion to its rows (:func:`global_progress_share`).

    The shards are planned once per job and stored first, so other workers fit shards while
    this process fits the global model; it then claims and fits shards too, each read by
    ``read_rows`` (only the chunks holding its rows), stored as soon as it is fitted and once.
    Memory holds ``split``, the plan until it is stored, then one shard's rows at a time (and
    one chunk while they are read), never every row. When no shard is free it waits
    ``wait_s`` and looks again: a claim that went stale is free again. Progress counts the
    keys done over every claimant. ``limits`` bounds the keys' length and the coefficients of
    every key's lines, checked before any shard is planned. Returns the global fit and the
    keys' summary (counts by
    status, failures, min-loss quantiles) once every shard is stored.
    """
    plan = plan_shards(
        read_keys, keyed.keys_per_shard, max_key_chars=limits.max_key_chars, column=keyed.split_by
    )
    # Refused before any shard is planned or stored: nothing is left to clean.
    limits.check_coefficients(plan.distinct.size, max(spec.all_n_components), split.n_features)
    shards.plan(plan.shards)
    distinct, rows_without_key = plan.distinct, plan.rows_without_key
    share = global_progress_share(split.X_train.shape[0], sum(rows.size for _, rows in plan.shards))
    del plan

    def global_progress(fraction: float, info: dict[str, Any]) -> None:
        if progress is not None:
            progress(fraction * share, info)

    fitted = fit_split(split, spec, progress=global_progress)
    counted = {"at": -math.inf, "keys_done": 0}

    def key_progress(*, refresh: bool = False) -> None:
        # Called between batches of keys and while waiting: a cancellation stops the fit there.
        if progress is None:
            return
        if refresh or time.monotonic() - counted["at"] >= wait_s:
            counted["at"], counted["keys_done"] = time.monotonic(), shards.counts().keys_done
        fraction = share + (1 - share) * counted["keys_done"] / max(distinct.size, 1)
        progress(fraction, {"keys_done": counted["keys_done"], "n_keys": int(distinct.size)})

    def fitting(keys_done: int) -> None:
        shards.fitting(keys_done)
        key_progress()

    while True:
        claim = shards.claim()
        if claim is None:
            counts = shards.counts()
            key_progress(refresh=True)
            if counts.done == counts.n_shards:
                break
            time.sleep(wait_s)
            continue
        X, y, keys = read_rows(claim.rows)
        arrays = fit_shard(X, y, keys, claim.position, spec, keyed.small_keys, fitting)
        del X, y, keys
        shards.store(claim.position, arrays)
    stored = shards.load()
    n_keys = int(stored["keys"].size) if stored else 0
    summary = mixreg.KeyedMixture(
        keys=stored.get("keys", distinct[:0]),
        coef=stored.get("coef", np.zeros((0, spec.n_components, split.n_features))),
        intercept=stored.get("intercept", np.zeros((0, spec.n_components))),
        shares=stored.get("shares", np.zeros((0, spec.n_components))),
        min_loss=stored.get("min_loss", np.zeros(0)),
        n_rows=stored.get("n_rows", np.zeros(0, dtype=np.int64)),
        status=stored.get("status", np.zeros(0, dtype=np.int8)),
        rows_without_key=rows_without_key,
        failures={
            str(key): mixreg.FAILURE_REASON
            for key in stored["keys"][stored["status"] == mixreg.STATUSES.index("failed")][
                : mixreg.MAX_FAILURES_LISTED
            ]
        }
        if n_keys
        else {},
    ).summary()
    return fitted, summary


def global_progress_share(n_global_rows: int, n_keyed_rows: int) -> float:
    """Share of a keyed fit's progress taken by its global model: its training rows' share of
    the rows fitted, as its search and the keys' fits cost about as much per row
    (bench/RESULTS.md: 82,000 rows/s for the keys, a 10 s search on 1,000,000 rows). A fixed
    tenth held the bar near 10 % for most of a job whose global model fits every row."""
    return n_global_rows / max(n_global_rows + n_keyed_rows, 1)


def run_shards(
    job_id: str,
    database_url: str,
    *,
    worker_id: str,
    heartbeat_interval_s: float = 1.0,
    stale_after_s: float = 15.0,
    worker_alive: Connection | None = None,
    log_format: LogFormat | None = None,
) -> int:
    """Fit shards of the keyed job ``job_id`` beside the process that runs the job: claim a
    free (or stale) shard, read only its rows from the dataset, fit and store it; until no
    shard is free. Returns how many shards this call stored.

    Runs in a child process of a worker (``worker_id``); memory holds one shard's rows and one
    chunk of the dataset. Stops (storing nothing more) when the job is finished or being
    cancelled, and exits when ``worker_alive`` closes (its worker died): its claim goes stale
    and another claimant fits the shard.
    """
    if log_format is not None:
        configure_logging(log_format)
    engine = make_engine(database_url)
    try:
        with job_context(job_id):
            return _run_shards(
                make_sessionmaker(engine),
                job_id,
                worker_id=worker_id,
                heartbeat_interval_s=heartbeat_interval_s,
                stale_after_s=stale_after_s,
                worker_alive=worker_alive,
            )
    finally:
        engine.dispose()


def _key_blocks(session_factory: sessionmaker[Session], keyed: KeyedData) -> Iterator[NDArray[Any]]:
    """The key column of ``keyed``'s dataset, chunk by chunk (:func:`key_values`), in one read
    transaction."""
    with read_scope(session_factory) as session:
        dataset = repository.get_dataset(session, dataset_id=keyed.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {keyed.dataset_id} is gone")
        blocks = repository.iter_dataset_columns(session, dataset=dataset, names=[keyed.split_by])
        with contextlib.closing(blocks):
            for block in blocks:
                yield check_integer_keys(key_values(block[keyed.split_by]), keyed.split_by)


def _read_keyed_rows(
    session_factory: sessionmaker[Session], keyed: KeyedData, rows: IndexArray
) -> tuple[FloatArray, FloatArray, NDArray[Any]]:
    """The rows ``rows`` of ``keyed``'s dataset (X, y, keys), read from the chunks holding
    them only (:func:`models_store.repository.read_dataset_rows`)."""
    with read_scope(session_factory) as session:
        dataset = repository.get_dataset(session, dataset_id=keyed.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {keyed.dataset_id} is gone")
        return repository.read_dataset_rows(
            session, dataset=dataset, rows=rows, column=keyed.split_by
        )


def _run_shards(
    session_factory: sessionmaker[Session],
    job_id: str,
    *,
    worker_id: str,
    heartbeat_interval_s: float,
    stale_after_s: float,
    worker_alive: Connection | None,
) -> int:
    with read_scope(session_factory) as session:
        job = repository.get_job(session, job_id=job_id)
        if job is None or job.split_by is None or job.status in TERMINAL_JOB_STATUSES:
            return 0
        spec, keyed = FitSpec.of_job(job), KeyedData.of_job(job)
    stored = 0
    with ShardStore(
        session_factory,
        job_id=job_id,
        worker_id=worker_id,
        stale_after_s=stale_after_s,
        heartbeat_interval_s=heartbeat_interval_s,
        worker_alive=worker_alive,
    ) as shards:
        while (claim := shards.claim()) is not None:
            try:
                X, y, keys = _read_keyed_rows(session_factory, keyed, claim.rows)
            except JobLostError:
                return stored
            try:
                arrays = fit_shard(
                    X, y, keys, claim.position, spec, keyed.small_keys, shards.fitting
                )
            except FitCancelledError:
                logger.info("job %s ended; shard %d dropped", job_id, claim.position)
                return stored
            del X, y, keys
            stored += shards.store(claim.position, arrays)
    return stored


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
