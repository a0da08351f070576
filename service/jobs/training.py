"""The one fit path: ``run_job`` loads a claimed job, fits it and stores the model.

It runs in a child process of whichever worker claimed the job. The child heartbeats, writes
throttled progress, and stops when the job's cancellation is requested or the job is taken
away from it. Fitting and the one-line least-squares baseline share the holdout split, which
is derived from the job's seed alone, so a model can be reproduced from its record.

A k sweep fits every k on that same split with the same seed, one after the other, and stores
all its models together when the last one is done: a sweep that is cancelled or fails stores
none. Warnings of the fit (``ConvergenceWarning`` and ``mixreg``'s own) and a holdout min-loss
above the baseline's are recorded on the model and the job, which still succeeds.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
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
    MixtureOfLinearRegressions,
    MixtureScore,
    min_loss,
    mixture_score,
    nested_scores,
    predict_lines,
    preferred_n_components,
)
from models_store import registry, repository
from models_store.session import make_engine, make_sessionmaker, read_scope, session_scope
from models_store.tables import Job
from service.logs import LogFormat, configure_logging, job_context

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


def holdout_split(n_rows: int, holdout_fraction: float, seed: int) -> tuple[IndexArray, IndexArray]:
    """Training and holdout row indices, each in increasing order.

    The holdout is the first ``holdout_size`` entries of
    ``numpy.random.default_rng(seed).permutation(n_rows)``; every other row trains.
    """
    permutation = np.random.default_rng(seed).permutation(n_rows)
    n_holdout = holdout_size(n_rows, holdout_fraction)
    holdout = np.sort(permutation[:n_holdout])
    train = np.sort(permutation[n_holdout:])
    return train, holdout


@dataclass(frozen=True)
class TrainHoldout:
    """A dataset split into its training rows and its holdout rows, each in row order."""

    X_train: FloatArray
    y_train: FloatArray
    X_holdout: FloatArray
    y_holdout: FloatArray

    @property
    def n_features(self) -> int:
        """Columns of X."""
        return int(self.X_train.shape[1])

    @classmethod
    def of_arrays(cls, X: FloatArray, y: FloatArray, spec: FitSpec) -> TrainHoldout:
        """Split ``X`` and ``y`` as ``spec`` says (``holdout_split``)."""
        train, holdout = holdout_split(X.shape[0], spec.holdout_fraction, spec.seed)
        return cls(X[train], y[train], X[holdout], y[holdout])

    @classmethod
    def of_blocks(
        cls,
        blocks: Iterable[tuple[FloatArray, FloatArray]],
        *,
        n_rows: int,
        n_features: int,
        spec: FitSpec,
    ) -> TrainHoldout:
        """Split a dataset read as consecutive blocks of rows, copying each block's rows
        straight to their side: the whole matrix is never held besides its split."""
        _, holdout = holdout_split(n_rows, spec.holdout_fraction, spec.seed)
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
        return split


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

    @property
    def all_n_components(self) -> tuple[int, ...]:
        """Every k to fit, in increasing order."""
        return self.k_values or (self.n_components,)

    @classmethod
    def of_job(cls, job: Job) -> FitSpec:
        """The spec stored on ``job``."""
        return cls(
            algorithm=job.algorithm,
            n_components=job.n_components,
            params=dict(job.params),
            fit_intercept=job.fit_intercept,
            holdout_fraction=job.holdout_fraction,
            seed=job.seed if job.seed is not None else 0,
            time_budget_s=job.time_budget_s,
            k_values=None if job.k_values is None else tuple(job.k_values),
        )

    def estimator(self, n_components: int | None = None) -> MixtureOfLinearRegressions:
        """The unfitted estimator this spec describes (for ``n_components`` lines if given)."""
        return MixtureOfLinearRegressions(
            n_components=self.n_components if n_components is None else n_components,
            algorithm=self.algorithm,
            fit_intercept=self.fit_intercept,
            random_state=self.seed,
            time_budget=self.time_budget_s,
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
) -> list[str]:
    """Fit ``estimator`` and return the messages of the warnings it gave about the fit.

    Other warnings are issued again, as if nothing had caught them.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X, y, progress=progress)
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


def _line_min_loss(X: FloatArray, y: FloatArray, coef: FloatArray, intercept: FloatArray) -> float:
    return float(min_loss(y, predict_lines(X, coef, intercept)))


def least_squares_baseline(
    X_train: FloatArray,
    y_train: FloatArray,
    X_holdout: FloatArray,
    y_holdout: FloatArray,
    *,
    fit_intercept: bool,
) -> dict[str, Any]:
    """The single least-squares line on the training rows and its min-loss on both splits."""
    regression = LinearRegression(fit_intercept=fit_intercept).fit(X_train, y_train)
    coef = np.asarray(regression.coef_, dtype=np.float64).reshape(1, -1)
    intercept = np.asarray([regression.intercept_], dtype=np.float64).reshape(1)
    return {
        "coef": coef[0].tolist(),
        "intercept": float(intercept[0]),
        "train_min_loss": _line_min_loss(X_train, y_train, coef, intercept),
        "holdout_min_loss": (
            _line_min_loss(X_holdout, y_holdout, coef, intercept) if len(y_holdout) else None
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
    ``info["n_components"]``. Each k gets the whole time budget. Ties in BIC go to the smaller
    k. Raises ``ValueError`` like :func:`fit_mixture`.
    """
    return fit_split(TrainHoldout.of_arrays(X, y, spec), spec, progress=progress)


def fit_split(
    split: TrainHoldout, spec: FitSpec, *, progress: ProgressCallback | None = None
) -> FittedSweep:
    """``fit_sweep`` on data already split by ``TrainHoldout``."""
    X_train, y_train = split.X_train, split.y_train
    X_holdout, y_holdout = split.X_holdout, split.y_holdout
    all_k = spec.all_n_components
    # Overflow is reported by check_finite_result as a precise error instead of as
    # RuntimeWarnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        baseline = least_squares_baseline(
            X_train, y_train, X_holdout, y_holdout, fit_intercept=spec.fit_intercept
        )
        fits = [
            _fit_one(
                spec,
                k,
                X_train,
                y_train,
                X_holdout,
                y_holdout,
                baseline,
                _sweep_progress(progress, position, len(all_k), k),
            )
            for position, k in enumerate(all_k)
        ]
    # k lines contain every mixture of fewer: their likelihood never falls as k grows.
    scores = nested_scores([(fit.n_components, fit.score) for fit in fits], len(y_train))
    fits = [replace(fit, score=score) for fit, score in zip(fits, scores, strict=True)]
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


def _fit_one(
    spec: FitSpec,
    n_components: int,
    X_train: FloatArray,
    y_train: FloatArray,
    X_holdout: FloatArray,
    y_holdout: FloatArray,
    baseline: dict[str, Any],
    progress: ProgressCallback | None,
) -> FittedMixture:
    estimator = spec.estimator(n_components)
    params = estimator.resolved_parameters(*X_train.shape)
    # The time budget is the job's own field, not an algorithm parameter.
    params.pop("time_budget", None)
    started = time.perf_counter()
    try:
        fit_warnings = _fit_recording_warnings(estimator, X_train, y_train, progress)
    except OverflowError:
        raise ValueError(f"the fit overflows a float64; {RESCALE_HINT}") from None
    fit_seconds = time.perf_counter() - started
    coef = np.asarray(estimator.coef_, dtype=np.float64)
    intercept = np.asarray(estimator.intercept_, dtype=np.float64)
    train_min_loss = _line_min_loss(X_train, y_train, coef, intercept)
    holdout_min_loss = (
        _line_min_loss(X_holdout, y_holdout, coef, intercept) if len(y_holdout) else None
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
        score=mixture_score(X_train, y_train, coef, intercept, fit_intercept=spec.fit_intercept),
        candidates=None if candidates is None else [_candidate(item) for item in candidates],
        warnings=[*fit_warnings, *([poor] if poor else [])],
    )
    check_finite_result(fitted)
    return fitted


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

    def _run(self) -> None:
        while True:
            if self._worker_alive is not None and self._worker_alive.poll():
                logger.error("job %s: the worker process is gone; stopping the fit", self._job_id)
                os._exit(EXIT_PARENT_LOST)
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
) -> str:
    """Fit the running job ``job_id`` and store its model (a k sweep: one per k), finishing the
    job in the same unit of work.

    ``worker_id`` is the worker that claimed the job (default: whichever the job names) and
    ``attempt`` the attempt it claimed (default: the current one); a job that meanwhile went to
    another worker or attempt is left alone, and the process exits as soon as its heartbeat
    finds that out (``EXIT_ATTEMPT_SUPERSEDED``). The heartbeat starts before the data are
    loaded, so a slow load never looks like a lost worker. ``worker_alive`` is the read end of
    a pipe held open by the worker process; the fit stops when it closes. ``data_loaded`` is set
    once the data are loaded (the worker's time limit counts from then). ``log_format``, when
    given, configures the logging of this process (a fit process does not inherit its
    worker's); every line logged during the fit names ``job_id``. Returns the status the job
    was left in by this call (``"lost"`` if the job was not, or stopped being, owned by the
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
            )
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _Attempt:
    """Who runs the job: the worker that claimed it and its attempt number."""

    worker_id: str
    attempt: int


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
    session_factory: sessionmaker[Session], job_id: str, owner: _Attempt
) -> _ClaimedJob | None:
    """Read the job's spec and split its dataset; None if the attempt is no longer current.

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
        data = TrainHoldout.of_blocks(
            repository.iter_dataset_blocks(session, dataset=dataset),
            n_rows=dataset.n_rows,
            n_features=dataset.n_features,
            spec=spec,
        )
        return _ClaimedJob(
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            dataset_id=job.dataset_id,
            name=job.name,
            spec=spec,
            data=data,
            feature_names=list(dataset.feature_names),
            registered_model=job.registered_model,
        )


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
        claimed = _load_claimed_job(session_factory, job_id, owner)
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
            fitted = fit_split(data, spec, progress=progress)
        except JobLostError:
            return "lost"
        except FitCancelledError:
            status = "cancelled"
        except ValueError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:
            logger.exception("job %s: the fit raised", job_id)
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            heartbeat.stop()
            try:
                _store_models(session_factory, job_id, claimed, fitted)
            except JobLostError:
                return "lost"
            return "succeeded"
        heartbeat.stop()
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
) -> None:
    """Store the model of every k and finish the job together; roll all back if the job was
    taken away."""
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
            ).id
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
