"""The estimator: parameters, fit/predict/min_loss; the algorithms live in their own modules."""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from ._am import SolverResult, classic_am, gradient_am
from ._em import EMResult, em
from ._loss import assign, predict_lines, row_min_losses, single_threaded_blas
from ._lstsq import lstsq_by_label
from ._subsample import (
    exhaustive_partition_batches,
    largest_enumerable_size,
    random_partition_batches,
    stirling2,
    subsample_search,
)
from ._validation import (
    PARAMETER_NAMES,
    check_algorithm,
    check_X,
    check_X_y,
    resolve_parameters,
)

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]

# Algorithm 2 refuses to enumerate more partitions than this.
MAX_EXHAUSTIVE_PARTITIONS = 100_000
# Share of the progress fraction given to the sub-sample phase of "subsample+am".
_SUBSAMPLE_PHASE = 0.8


def as_generator(random_state: Any) -> np.random.Generator:
    """The one random generator of a fit.

    ``None`` gives fresh entropy, an int seeds a new generator, a ``Generator`` is used as is
    and a legacy ``RandomState`` seeds a new generator from its stream.
    """
    if random_state is None:
        return np.random.default_rng()
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return np.random.default_rng(int(random_state))
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1, size=4))
    raise ValueError(
        f"random_state must be None, an int, a numpy Generator or RandomState; got {random_state!r}"
    )


# Squared errors of larger targets overflow a float64.
MAX_ABS_Y = 1e150


def _max_row_norm(X: FloatArray, block_rows: int = 1 << 16) -> float:
    """Largest Euclidean norm of a row, without overflow for huge entries or a copy of X."""
    largest = max(abs(float(X.max())), abs(float(X.min())))
    if largest == 0.0 or not np.isfinite(largest):
        return largest
    squared = 0.0
    for start in range(0, X.shape[0], block_rows):
        block = X[start : start + block_rows] / largest
        squared = max(squared, float(np.max(np.einsum("ij,ij->i", block, block))))
    return largest * float(np.sqrt(squared))


@dataclass(frozen=True)
class _Scaling:
    """The paper's scaling: max row norm of X and max |y| both 1, so step sizes keep meaning."""

    x_scale: float
    y_scale: float
    fit_intercept: bool

    @classmethod
    def of(cls, X: FloatArray, y: FloatArray, fit_intercept: bool) -> _Scaling:
        y_scale = float(np.max(np.abs(y)))
        if y_scale > MAX_ABS_Y:
            raise ValueError(
                f"|y| reaches {y_scale:.3g}: squared errors of such values overflow a float64; "
                f"scale y down (|y| <= {MAX_ABS_Y:.0e})"
            )
        return cls(_max_row_norm(X) or 1.0, y_scale or 1.0, fit_intercept)

    def design(self, X: FloatArray) -> FloatArray:
        """Scaled design matrix, with a column of ones when an intercept is fitted."""
        n_samples, n_features = X.shape
        Z = np.empty((n_samples, n_features + self.fit_intercept))
        np.multiply(X, 1.0 / self.x_scale, out=Z[:, :n_features])
        if self.fit_intercept:
            Z[:, n_features] = 1.0
        return Z

    def to_scaled(self, lines: FloatArray) -> FloatArray:
        """Caller-unit lines (coefficients then intercept) to scaled-space parameters."""
        theta = lines / self.y_scale
        theta[:, : theta.shape[1] - self.fit_intercept] *= self.x_scale
        return theta

    def to_caller(self, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Scaled-space parameters to (coef, intercept) in the caller's units."""
        n_features = theta.shape[1] - self.fit_intercept
        coef = theta[:, :n_features] * (self.y_scale / self.x_scale)
        if self.fit_intercept:
            intercept = theta[:, n_features] * self.y_scale
        else:
            intercept = np.zeros(theta.shape[0])
        return coef, intercept


@dataclass
class _FitContext:
    """What every solver of a fit needs: scaled data, parameters, randomness, clock, progress."""

    Z: FloatArray
    y: FloatArray
    n_components: int
    n_features: int
    params: dict[str, Any]
    rng: np.random.Generator
    deadline: float | None
    started: float
    loss_scale: float
    progress: ProgressCallback | None

    def report(
        self,
        fraction: float,
        *,
        iteration: int | None = None,
        candidates: int | None = None,
        loss: float | None = None,
    ) -> None:
        if self.progress is None:
            return
        budget = self.params.get("time_budget")
        if budget is not None:
            fraction = max(fraction, (time.monotonic() - self.started) / budget)
        self.progress(
            min(max(fraction, 0.0), 1.0),
            {
                "iteration": iteration,
                "candidates_tried": candidates,
                "best_loss": None if loss is None else loss * self.loss_scale,
            },
        )

    @property
    def fit_intercept(self) -> bool:
        return bool(self.Z.shape[1] > self.n_features)

    @property
    def min_samples(self) -> int:
        # RANSACRegressor's default: one more row than there are features.
        return self.n_features + 1


def _random_lines(ctx: _FitContext) -> FloatArray:
    """Gaussian lines in the scaled space (the paper's random initialization of Algorithm 1)."""
    lines: FloatArray = ctx.rng.standard_normal((ctx.n_components, ctx.Z.shape[1]))
    return lines


def _random_partition_lines(ctx: _FitContext) -> FloatArray:
    """Least-squares lines of a random partition of the rows (flexmix's default start)."""
    labels = np.asarray(ctx.rng.integers(0, ctx.n_components, size=ctx.Z.shape[0]), dtype=np.intp)
    theta, _ = lstsq_by_label(ctx.Z, ctx.y, labels, ctx.n_components)
    return theta


def _restarts(
    ctx: _FitContext,
    solve: Callable[..., SolverResult],
    random_start: Callable[[_FitContext], FloatArray],
) -> SolverResult:
    """Run ``n_init`` starts (or the given ``init``) and keep the lowest training min-loss."""
    n_init, max_iter = ctx.params["n_init"], ctx.params["max_iter"]
    results: list[SolverResult] = []
    for start in range(n_init):
        theta0 = ctx.params["init"] if ctx.params["init"] is not None else random_start(ctx)
        best_so_far = min((result.loss for result in results), default=np.inf)

        def on_step(
            iteration: int, loss: float, start: int = start, floor: float = best_so_far
        ) -> None:
            ctx.report(
                (start + iteration / max_iter) / n_init, iteration=iteration, loss=min(loss, floor)
            )

        results.append(solve(theta0, callback=on_step))
        if ctx.deadline is not None and time.monotonic() > ctx.deadline:
            break
    return min(results, key=lambda result: result.loss)


def _iterative(
    solver: Callable[..., SolverResult],
    random_start: Callable[[_FitContext], FloatArray],
    *extra_params: str,
) -> Callable[[_FitContext], SolverResult]:
    """An iterative algorithm (AM, classical AM, EM) run from ``n_init`` starts."""

    def fit(ctx: _FitContext) -> SolverResult:
        p = ctx.params
        solve = partial(
            solver,
            ctx.Z,
            ctx.y,
            max_iter=p["max_iter"],
            tol=p["tol"],
            deadline=ctx.deadline,
            **{name: p[name] for name in extra_params},
        )
        return _restarts(ctx, solve, random_start)

    return fit


def _subsample(ctx: _FitContext, size: int) -> NDArray[np.intp]:
    """The sub-sample A: ``size`` rows drawn uniformly with replacement."""
    rows: NDArray[np.intp] = ctx.rng.integers(0, ctx.Z.shape[0], size=size)
    return rows


def _search(
    ctx: _FitContext,
    batches: Iterator[NDArray[np.intp]],
    *,
    size: int,
    total: int,
    phase: float = 1.0,
    deadline: float | None = None,
) -> SolverResult:
    """Algorithms 2 and 3 on a fresh sub-sample of ``size`` rows, reporting progress."""
    return subsample_search(
        ctx.Z,
        ctx.y,
        batches,
        subsample=_subsample(ctx, size),
        n_components=ctx.n_components,
        base=ctx.params["base"],
        rng=ctx.rng,
        min_samples=ctx.min_samples,
        fit_intercept=ctx.fit_intercept,
        deadline=deadline if deadline is not None else ctx.deadline,
        callback=lambda tried, loss: ctx.report(phase * tried / total, candidates=tried, loss=loss),
    )


def _fit_subsample(
    ctx: _FitContext, *, phase: float = 1.0, deadline: float | None = None
) -> SolverResult:
    """Algorithm 3: random partitions of the sub-sample."""
    size, total = ctx.params["subsample_size"], ctx.params["n_partitions"]
    # The sub-sample is drawn before the partitions (the generator is consumed lazily).
    batches = random_partition_batches(ctx.rng, total, size, ctx.n_components)
    return _search(ctx, batches, size=size, total=total, phase=phase, deadline=deadline)


def _fit_subsample_exhaustive(ctx: _FitContext) -> SolverResult:
    """Algorithm 2: every partition of the sub-sample."""
    size = ctx.params["subsample_size"]
    batches = exhaustive_partition_batches(size, ctx.n_components)
    return _search(ctx, batches, size=size, total=stirling2(size, ctx.n_components))


def _fit_subsample_am(ctx: _FitContext) -> SolverResult:
    """The paper's A3: Algorithm 3, then Algorithm 1 started from its lines."""
    p = ctx.params
    search_deadline = None
    if ctx.deadline is not None:
        # The budget covers the whole fit: most of it for the anytime search, the rest for AM.
        search_deadline = ctx.started + _SUBSAMPLE_PHASE * (ctx.deadline - ctx.started)
    initial = _fit_subsample(ctx, phase=_SUBSAMPLE_PHASE, deadline=search_deadline)
    refined = gradient_am(
        ctx.Z,
        ctx.y,
        initial.theta,
        step_size=p["step_size"],
        max_iter=p["max_iter"],
        tol=p["tol"],
        deadline=ctx.deadline,
        callback=lambda iteration, loss: ctx.report(
            _SUBSAMPLE_PHASE + (1 - _SUBSAMPLE_PHASE) * iteration / p["max_iter"],
            iteration=iteration,
            candidates=initial.n_candidates,
            loss=loss,
        ),
    )
    refined.loss_history = initial.loss_history + refined.loss_history[1:]
    refined.n_candidates = initial.n_candidates
    return refined


_SOLVERS: dict[str, Callable[[_FitContext], SolverResult]] = {
    "am": _iterative(gradient_am, _random_lines, "step_size"),
    "am-classic": _iterative(classic_am, _random_partition_lines),
    "subsample": _fit_subsample,
    "subsample-exhaustive": _fit_subsample_exhaustive,
    "subsample+am": _fit_subsample_am,
    "em": _iterative(em, _random_partition_lines),
}


class MixtureOfLinearRegressions(BaseEstimator):  # type: ignore[misc]
    """Mixture of k linear regressions with list-decoded predictions.

    Fits k lines ``y ~ <x, coef_j> + intercept_j`` that minimise the min-loss
    ``(1/n) sum_i min_j (y_i - <x_i, coef_j> - intercept_j)^2`` (no generative model assumed) and
    predicts, for each row, the list of the k lines' values.

    Internally the data are scaled as in the paper (max row norm of X and max |y| equal 1, with
    a constant column for the intercept), so ``step_size`` keeps the paper's meaning; fitted
    lines are reported in the caller's units.

    Parameters
    ----------
    n_components : int, default=2
        The number of lines k.
    algorithm : {"subsample+am", "am", "am-classic", "subsample", "subsample-exhaustive", "em"}
        - ``"am"``: Algorithm 1, gradient AM from Gaussian random lines (or ``init``).
        - ``"am-classic"``: AM with an exact least-squares refit per part, started from the lines
          of a random partition of the rows.
        - ``"subsample"``: Algorithm 3, ``n_partitions`` random partitions of a sub-sample of
          ``subsample_size`` rows, a least-squares or RANSAC line per part, the best candidate on
          all rows, refitted on the rows each line wins.
        - ``"subsample-exhaustive"``: Algorithm 2, every partition of the sub-sample.
        - ``"subsample+am"`` (default): the paper's A3, Algorithm 3 then Algorithm 1 from its lines.
        - ``"em"``: EM for a Gaussian mixture of regressions (per-line weight and noise variance),
          started like flexmix from a random partition of the rows.
    fit_intercept : bool, default=True
    random_state : None, int, numpy.random.Generator or RandomState
        The single source of randomness of a fit.
    step_size : float, default=0.1
        The paper's gamma (``am``, ``subsample+am``).
    max_iter : int, default=100 (200 for ``em``)
        The paper's T (``am``, ``am-classic``, ``subsample+am``, ``em``).
    tol : float, default=1e-6
        Stop when the relative change of the min-loss (of the log-likelihood for ``em``)
        between iterations is at most ``tol``.
    n_init : int, default=1
        Random starts (``am``, ``am-classic``, ``em``); the lowest training min-loss is kept.
    init : array-like of shape (n_components, n_features + fit_intercept), optional
        Starting lines: coefficients then intercept, in the caller's units
        (``am``, ``am-classic``, ``em``).
    subsample_size : int, default=150
        |A|, drawn uniformly with replacement. For ``subsample-exhaustive`` the default is the
        largest size whose number of partitions (a Stirling number) is at most 100,000.
    n_partitions : int, default=1000
        The paper's h (``subsample``, ``subsample+am``).
    base : {"ls", "ransac"}, default="ls"
        Fit per part and for the final refit: least squares, or RANSAC with
        ``sklearn.linear_model.RANSACRegressor``'s default semantics.
    time_budget : float, optional
        Seconds. The sub-sample search is anytime and returns the best candidate found so far;
        iterative algorithms return their current lines. At least one batch or step runs.

    Attributes
    ----------
    coef_ : ndarray of shape (n_components, n_features)
    intercept_ : ndarray of shape (n_components,)
    shares_ : ndarray of shape (n_components,)
        Fraction of training rows each line predicts best. Components are ordered by share,
        largest first (ties by intercept, then coefficients).
    loss_history_ : ndarray
        Training min-loss per iteration (AM, EM) or best candidate per batch of partitions
        followed by the loss after the refit (sub-sample algorithms); for ``subsample+am`` the
        search's history followed by AM's.
    n_iter_ : int
        Iterations run (AM, EM), or candidate line sets tried (``subsample``,
        ``subsample-exhaustive``).
    n_candidates_ : int
        Candidate line sets tried (sub-sample algorithms; 0 otherwise).
    converged_ : bool
    train_loss_ : float
        Training min-loss of the fitted lines.
    weights_, noise_variance_ : ndarray of shape (n_components,)
        Only for ``em``: the mixture weights and per-line noise variances (caller's units).
    n_features_in_ : int

    Notes
    -----
    A line that wins no training rows is never refitted on an empty set: AM leaves it where
    it is (its gradient is zero), classical AM and the sub-sample refit keep its previous
    value, EM floors its weight and variance. It keeps a share of 0 and finite coefficients.
    """

    def __init__(
        self,
        n_components: int = 2,
        algorithm: str = "subsample+am",
        fit_intercept: bool = True,
        random_state: Any = None,
        step_size: float | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        n_init: int | None = None,
        init: ArrayLike | None = None,
        subsample_size: int | None = None,
        n_partitions: int | None = None,
        base: str | None = None,
        time_budget: float | None = None,
    ) -> None:
        self.n_components = n_components
        self.algorithm = algorithm
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.step_size = step_size
        self.max_iter = max_iter
        self.tol = tol
        self.n_init = n_init
        self.init = init
        self.subsample_size = subsample_size
        self.n_partitions = n_partitions
        self.base = base
        self.time_budget = time_budget

    def resolved_parameters(self, n_samples: int, n_features: int) -> dict[str, Any]:
        """Check the estimator's settings for data of this size; return the algorithm's params.

        Raises ValueError naming what is wrong. The service calls this before queueing a fit.
        """
        algorithm = check_algorithm(self.algorithm)
        if (
            isinstance(self.n_components, bool)
            or not isinstance(self.n_components, numbers.Integral)
            or self.n_components < 1
        ):
            raise ValueError(f"n_components must be an integer >= 1; got {self.n_components!r}")
        if self.n_components > n_samples:
            raise ValueError(
                f"n_components={self.n_components} exceeds the {n_samples} training rows"
            )
        if not isinstance(self.fit_intercept, bool | np.bool_):
            raise ValueError(f"fit_intercept must be True or False; got {self.fit_intercept!r}")
        given = {name: getattr(self, name) for name in PARAMETER_NAMES}
        params = resolve_parameters(
            algorithm,
            given,
            n_components=int(self.n_components),
            n_samples=n_samples,
            n_params=n_features + bool(self.fit_intercept),
        )
        if algorithm == "subsample-exhaustive":
            k = int(self.n_components)
            if params["subsample_size"] is None:
                params["subsample_size"] = largest_enumerable_size(k, MAX_EXHAUSTIVE_PARTITIONS)
            count = stirling2(params["subsample_size"], k)
            if count > MAX_EXHAUSTIVE_PARTITIONS:
                largest = largest_enumerable_size(k, MAX_EXHAUSTIVE_PARTITIONS)
                raise ValueError(
                    f"subsample-exhaustive would try all {count:,} partitions of "
                    f"{params['subsample_size']} rows into {k} parts, more than the cap of "
                    f"{MAX_EXHAUSTIVE_PARTITIONS:,}; use subsample_size <= {largest}, or "
                    f"algorithm='subsample', which tries n_partitions random partitions"
                )
        return params

    def fit(
        self, X: ArrayLike, y: ArrayLike, progress: ProgressCallback | None = None
    ) -> MixtureOfLinearRegressions:
        """Fit the k lines.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        progress : callable, optional
            ``progress(fraction, info)`` is called as the fit advances, with ``info`` holding
            ``iteration``, ``candidates_tried`` and ``best_loss`` (training min-loss so far, in
            the caller's units; ``None`` where not applicable). An exception raised by it stops
            the fit and propagates.

        Returns
        -------
        self
        """
        started = time.monotonic()
        X_arr, y_arr = check_X_y(X, y)
        n_samples, n_features = X_arr.shape
        params = self.resolved_parameters(n_samples, n_features)
        scaling = _Scaling.of(X_arr, y_arr, bool(self.fit_intercept))
        if params.get("init") is not None:
            params["init"] = scaling.to_scaled(params["init"])
        budget = params.get("time_budget")
        ctx = _FitContext(
            Z=scaling.design(X_arr),
            y=y_arr / scaling.y_scale,
            n_components=int(self.n_components),
            n_features=n_features,
            params=params,
            rng=as_generator(self.random_state),
            deadline=None if budget is None else started + budget,
            started=started,
            loss_scale=scaling.y_scale**2,
            progress=progress,
        )
        with single_threaded_blas():
            result = _SOLVERS[self.algorithm](ctx)

        coef, intercept = scaling.to_caller(result.theta)
        _, labels = assign(ctx.Z, ctx.y, result.theta)
        shares = np.bincount(labels, minlength=ctx.n_components) / n_samples
        order = np.lexsort((*coef.T[::-1], intercept, -shares))
        self.coef_ = coef[order]
        self.intercept_ = intercept[order]
        self.shares_ = shares[order]
        self.loss_history_ = np.asarray(result.loss_history) * ctx.loss_scale
        self.train_loss_ = float(
            row_min_losses(y_arr, predict_lines(X_arr, self.coef_, self.intercept_)).mean()
        )
        self.n_iter_ = result.n_iter
        self.n_candidates_ = result.n_candidates
        self.converged_ = result.converged
        self.n_features_in_ = n_features
        if isinstance(result, EMResult):
            assert result.weights is not None and result.variances is not None
            self.weights_ = result.weights[order]
            self.noise_variance_ = result.variances[order] * ctx.loss_scale
        ctx.report(
            1.0,
            iteration=result.n_iter,
            candidates=result.n_candidates or None,
            loss=self.train_loss_ / ctx.loss_scale,
        )
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(
                "This MixtureOfLinearRegressions is not fitted yet; call fit(X, y) first."
            )

    def predict(self, X: ArrayLike) -> FloatArray:
        """List-decoded predictions: one column per line.

        Returns
        -------
        predictions : ndarray of shape (n_samples, n_components)
        """
        self._check_fitted()
        X_arr = check_X(X, n_features=self.n_features_in_)
        return predict_lines(X_arr, self.coef_, self.intercept_)

    def min_loss(self, X: ArrayLike, y: ArrayLike) -> float:
        """The paper's min-loss of the fitted lines on (X, y)."""
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        return float(row_min_losses(y_arr, predictions).mean())

    def best_component(self, X: ArrayLike, y: ArrayLike) -> NDArray[np.intp]:
        """Index of the line that predicts each row best (ties to the lowest index)."""
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        best: NDArray[np.intp] = np.argmin(np.abs(predictions - y_arr[:, None]), axis=1)
        return best
