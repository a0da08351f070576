"""The estimator: parameters, fit/predict/min_loss; the algorithms live in their own modules."""

from __future__ import annotations

import numbers
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from ._am import SolverResult, assign_many, refit_exactly_until_stable
from ._auto import AutoResult, default_n_init, fit_auto, grouped_mixture
from ._document import gate_document, lines_document, read_lines
from ._em import EMResult, e_step, em_batch
from ._gate import (
    GatedEMResult,
    GateScaling,
    gated_em_batch,
    gated_log_densities,
    log_gate,
    log_softmax,
)
from ._inference import (
    BootstrapResult,
    GatedParameters,
    bootstrap_replicates,
    caller_jacobian,
    check_level,
    covariance_from_information,
    gated_caller_jacobian,
    gated_likelihood_pass,
    gated_maximum_likelihood,
    likelihood_pass,
    maximum_likelihood_polish,
    normal_quantile,
)
from ._likelihood import best_maximum_likelihood
from ._loss import (
    Grouping,
    predict_lines,
    row_min_losses,
    single_threaded_blas,
    weighted_mean,
    weighted_min_loss,
)
from ._solvers import GROUPED_ALGORITHMS, SOLVERS, FitContext, random_partition_lines
from ._streamed import fit_streamed, streamed_source
from ._subsample import capped_stirling2, largest_enumerable_size
from ._summary import InferenceSummary, gate_summary_rows, summary_table
from ._validation import (
    PARAMETER_NAMES,
    check_algorithm,
    check_concomitant,
    check_groups,
    check_sample_weight,
    check_X,
    check_X_y,
    resolve_parameters,
)

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]

# Algorithm 2 refuses to enumerate more partitions than this.
MAX_EXHAUSTIVE_PARTITIONS = 100_000
# With one line there is one partition of any sub-sample: its default size is then the other
# sub-sample algorithms' default.
DEFAULT_EXHAUSTIVE_SIZE_LIMIT = 150

_SOLVERS: dict[str, Callable[[FitContext], SolverResult]] = {**SOLVERS, "auto": fit_auto}


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


def _column_extent(X: FloatArray, block_rows: int = 1 << 16) -> FloatArray:
    """Largest absolute value of every column, without a copy of X."""
    extent = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], block_rows):
        np.maximum(extent, np.abs(X[start : start + block_rows]).max(axis=0), out=extent)
    return extent


@dataclass(frozen=True)
class _Scaling:
    """Standardized units: each feature centred and scaled, then the paper's scaling.

    With an intercept, each feature is centred on its mean and y on its mean (as
    scikit-learn's ``LinearRegression`` does before it solves): a feature far from zero (a
    year, a timestamp, a price) then loses no precision, and the units the algorithms see
    do not depend on the location or scale of any feature or of y, so every algorithm is
    equivariant under affine changes of the data. Each feature is divided by its standard
    deviation, then all by the largest row norm, and y by its largest absolute deviation:
    max row norm of X and max |y| are 1, as in the paper, so step sizes keep their meaning.
    """

    x_mean: FloatArray
    x_scale: FloatArray
    y_mean: float
    y_scale: float
    fit_intercept: bool

    @classmethod
    def of(
        cls,
        X: FloatArray,
        y: FloatArray,
        fit_intercept: bool,
        sample_weight: FloatArray | None = None,
    ) -> tuple[_Scaling, FloatArray, FloatArray]:
        """The scaling of (X, y), with the design matrix and target in its units.

        With positive ``sample_weight``, means and standard deviations are weighted (a row
        of integer weight ``w`` counts as ``w`` copies); extents do not depend on weights.
        """
        y_extent = float(np.max(np.abs(y)))
        if y_extent > MAX_ABS_Y:
            raise ValueError(
                f"|y| reaches {y_extent:.3g}: squared errors of such values overflow a float64; "
                f"scale y down (|y| <= {MAX_ABS_Y:.0e})"
            )
        n_samples, n_features = X.shape
        # Divided by a power of two above each column's extent first (exact: no rounding is
        # added to features far from zero), so neither a sum nor a square overflows.
        _, exponent = np.frexp(_column_extent(X))
        extent = np.ldexp(1.0, np.minimum(exponent, 1023))
        Z = np.empty((n_samples, n_features + fit_intercept))
        features = Z[:, :n_features]
        np.divide(X, extent, out=features)
        x_mean = np.zeros(n_features)
        if fit_intercept:
            x_mean = (
                features.mean(axis=0)
                if sample_weight is None
                else (sample_weight @ features) / sample_weight.sum()
            )
            features -= x_mean
            Z[:, n_features] = 1.0
        if sample_weight is None:
            spread = np.sqrt(np.einsum("ij,ij->j", features, features) / n_samples)
        else:
            spread = np.sqrt(
                np.einsum("i,ij,ij->j", sample_weight, features, features) / sample_weight.sum()
            )
        spread[spread <= np.finfo(np.float64).tiny] = 1.0
        features /= spread
        row_norm = float(np.sqrt(np.max(np.einsum("ij,ij->i", features, features))))
        row_norm = row_norm if row_norm > 0.0 else 1.0
        features /= row_norm
        y_mean = float(weighted_mean(y, sample_weight)) if fit_intercept else 0.0
        y_centred = y - y_mean
        y_scale = float(np.max(np.abs(y_centred))) or 1.0
        scaling = cls(
            x_mean=x_mean * extent,
            x_scale=extent * spread * row_norm,
            y_mean=y_mean,
            y_scale=y_scale,
            fit_intercept=fit_intercept,
        )
        return scaling, Z, y_centred / y_scale

    def to_scaled(self, lines: FloatArray) -> FloatArray:
        """Caller-unit lines (coefficients then intercept) to scaled-space parameters."""
        n_features = self.x_scale.size
        theta = np.array(lines, dtype=np.float64) / self.y_scale
        if self.fit_intercept:
            theta[:, n_features] += (
                lines[:, :n_features] @ self.x_mean - self.y_mean
            ) / self.y_scale
        theta[:, :n_features] *= self.x_scale
        return theta

    def to_caller(self, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Scaled-space parameters to (coef, intercept) in the caller's units.

        Raises ValueError when a slope is beyond a float64's range (features tiny next to the
        targets): such lines cannot be written down.
        """
        n_features = self.x_scale.size
        # Multiply, then divide: y_scale / x_scale alone may overflow, and 0 * inf is NaN.
        with np.errstate(over="ignore", invalid="ignore"):
            coef = theta[:, :n_features] * self.y_scale / self.x_scale
            intercept = np.zeros(theta.shape[0])
            if self.fit_intercept:
                intercept = self.y_mean + theta[:, n_features] * self.y_scale - coef @ self.x_mean
        if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
            raise ValueError(
                f"the fitted lines overflow a float64: a feature spreads over "
                f"{float(self.x_scale.min()):.3g} while y spreads over {self.y_scale:.3g}; "
                f"scale X up or y down"
            )
        return coef, intercept

    def line_jacobian(self) -> FloatArray:
        """Derivative of one line's caller-unit (coef, intercept) in its scaled parameters
        (:meth:`to_caller` is linear in them)."""
        n_features = self.x_scale.size
        factor = self.y_scale / self.x_scale
        jacobian = np.zeros((n_features + self.fit_intercept, n_features + self.fit_intercept))
        jacobian[np.arange(n_features), np.arange(n_features)] = factor
        if self.fit_intercept:
            jacobian[n_features, :n_features] = -factor * self.x_mean
            jacobian[n_features, n_features] = self.y_scale
        return jacobian


def component_order(
    coef: FloatArray, intercept: FloatArray, shares: FloatArray, x_mean: FloatArray
) -> NDArray[np.intp]:
    """The documented order of fitted lines: largest share first; equal shares by the line's
    value at the training rows' mean features (largest first, so the order does not depend
    on where the features' origin is), then by coefficients.

    The order depends only on the set of lines, never on the order they come in.
    """
    centre_value = intercept + coef @ x_mean
    order: NDArray[np.intp] = np.lexsort((*coef.T[::-1], -centre_value, -shares))
    return order


def _in_caller_units(losses: ArrayLike, loss_scale: float) -> FloatArray:
    """Scaled losses (or variances) in the caller's units. One beyond a float64's range (a
    terrible candidate on targets near ``MAX_ABS_Y``) is kept as the largest float64, a
    finite stand-in that still compares as worst."""
    with np.errstate(over="ignore"):
        values = np.asarray(losses, dtype=np.float64) * loss_scale
    return np.minimum(values, np.finfo(np.float64).max)


def _ends_in_least_squares(algorithm: str) -> bool:
    """Whether the algorithm ends at a fixed point of classical AM: each line the least-squares
    line of the rows it wins (the other algorithms keep their own, documented last step)."""
    return algorithm == "auto"


def _scaled_loss(ctx: FitContext, theta: FloatArray) -> float:
    """The (weighted, grouped) min-loss of lines in the scaled units of the fit."""
    squared, _ = assign_many(
        ctx.Z, ctx.y, theta[None], sample_weight=ctx.sample_weight, grouping=ctx.grouping
    )
    return float(weighted_mean(squared[0], ctx.sample_weight))


class StandardErrorWarning(UserWarning):
    """The standard errors of a fit do not exist (its observed information is singular)."""


# Gated EM stops when the mean log-likelihood per row changes by at most this, or after so many
# iterations; noise variances are floored at a tiny fraction of var(y) so that a line through a
# handful of rows cannot make the likelihood unbounded.
_GATE_TOL = 1e-8
_GATE_MAX_ITER = 1000
_GATE_VARIANCE_FLOOR = 1e-8
# EM restarts from random partitions of the rows whose best (by likelihood, each stopped when its
# mean log-likelihood per row changes by at most the tolerance) is gated EM's second start.
_GATE_EM_RESTARTS = 5
_GATE_RESTART_TOL = 1e-4

# Standard errors of a gated fit's gate, removed whenever the estimator is refitted.
_GATE_STANDARD_ERRORS = ("gate_coef_se_", "gate_intercept_se_")
# Fitted attributes of a gated fit, removed when the estimator is refitted without a gate.
_GATE_ATTRIBUTES = (
    "gate_coef_",
    "gate_intercept_",
    "log_likelihood_",
    "bic_",
    "log_likelihood_history_",
    "gate_n_iter_",
    "gate_converged_",
    "gate_start_",
    "gate_on_features_",
    "n_concomitant_in_",
    "weights_",
    "noise_variance_",
)
# The maximum-likelihood fit beside the lines (standard errors, grouped auto) and its errors,
# removed whenever the estimator is refitted.
_MIXTURE_ATTRIBUTES = (
    "ml_coef_",
    "ml_intercept_",
    "ml_start_",
    "coef_se_",
    "intercept_se_",
    "weights_se_",
    "noise_variance_se_",
    "covariance_",
)


@dataclass(frozen=True)
class _GatedFit:
    """Gated EM's result with the gate's design and scaling (standardized units)."""

    em: GatedEMResult
    scaling: GateScaling
    design: FloatArray
    start: str
    """``"lines"`` (the algorithm's) or ``"em restart"``: where the kept gated EM started."""


def _fit_gate(ctx: FitContext, columns: FloatArray, theta: FloatArray) -> _GatedFit:
    """Gated EM from the fitted lines and from the best of a batch of EM restarts, in the
    fit's scaled units; the start that ends with the higher likelihood is kept."""
    scaling, design = GateScaling.of(columns, ctx.sample_weight)
    floor = _GATE_VARIANCE_FLOOR * float(np.var(ctx.y)) + np.finfo(np.float64).tiny
    # The lowest min-loss lines need not lie near the likelihood's highest maximum (a line
    # through the rows two components share fits them well but explains neither): EM
    # restarts from random partitions, as flexmix starts, give a second start.
    restarts = em_batch(
        ctx.Z,
        ctx.y,
        random_partition_lines(ctx, _GATE_EM_RESTARTS),
        max_iter=_GATE_MAX_ITER,
        tol=_GATE_RESTART_TOL,
        deadline=ctx.deadline,
        variance_floor=floor,
        sample_weight=ctx.sample_weight,
    )
    best_restart = int(np.argmax([history[-1] for history in restarts.log_likelihood_histories]))
    results = gated_em_batch(
        ctx.Z,
        ctx.y,
        design,
        np.stack([theta, restarts.thetas[best_restart]]),
        max_iter=_GATE_MAX_ITER,
        tol=_GATE_TOL,
        variance_floor=floor,
        deadline=ctx.deadline,
        sample_weight=ctx.sample_weight,
    )
    chosen = int(np.argmax([result.log_likelihood_history[-1] for result in results]))
    return _GatedFit(
        em=results[chosen],
        scaling=scaling,
        design=design,
        start=("lines", "em restart")[chosen],
    )


def _finish_gate(ctx: FitContext, gate: _GatedFit) -> None:
    """Newton's method from gated EM's fit to the gated likelihood's maximum to working
    precision (gated EM stops at a change of 1e-8 per row; standard errors belong to the
    maximum): ``gate.em`` is updated in place, its last log-likelihood appended. Where Newton
    cannot finish (the information is not positive definite) gated EM's fit stays."""
    em_fit = gate.em
    start = GatedParameters(
        theta=em_fit.theta, variances=em_fit.variances, beta=em_fit.beta - em_fit.beta[0]
    )
    finished = gated_maximum_likelihood(ctx.Z, ctx.y, gate.design, start)
    if finished is None:
        return
    evaluated, params, _ = finished
    em_fit.theta, em_fit.variances, em_fit.beta = params.theta, params.variances, params.beta
    em_fit.log_likelihood_history = [
        *em_fit.log_likelihood_history,
        evaluated.log_likelihood / ctx.Z.shape[0],
    ]


def gate_parameter_count(n_components: int, n_params: int, n_concomitant: int) -> int:
    """Free parameters of a gated mixture: each line's coefficients (``n_params``, intercept
    included) and noise variance, and the gate's ``n_components - 1`` free rows."""
    return n_components * (n_params + 1) + (n_components - 1) * (n_concomitant + 1)


class DegenerateFitWarning(UserWarning):
    """Some fitted lines own too few training rows to be estimated (a degenerate fit)."""


def minimum_rows_per_line(n_params: int) -> int:
    """Rows a line must own: one more than its coefficients, so its noise has a residual."""
    return n_params + 1


def _warn_if_degenerate(rows_per_line: FloatArray, n_params: int) -> None:
    """Warn when a line owns fewer rows than its coefficients need, plus one for its noise."""
    needed = minimum_rows_per_line(n_params)
    owned = np.rint(rows_per_line).astype(int)
    few = np.flatnonzero(owned < needed)
    if few.size == 0:
        return
    k = owned.size
    warnings.warn(
        f"{few.size} of the {k} lines own fewer than the {needed} training rows a line with "
        f"{n_params} coefficients needs (they own {', '.join(str(owned[j]) for j in few)} "
        f"rows): such lines fit a handful of rows exactly and say nothing about new ones; "
        f"fit fewer lines (n_components) or give more rows (at least {k * needed} for "
        f"{k} lines)",
        DegenerateFitWarning,
        stacklevel=2,
    )


def _warn_if_unconverged(
    algorithm: str, result: SolverResult, params: dict[str, Any], deadline: float | None
) -> None:
    """Warn, saying what to change, when ``max_iter`` (not the time budget) stopped the fit."""
    max_iter = params.get("max_iter")
    if result.converged or max_iter is None or result.n_iter < max_iter:
        return
    if params["tol"] == 0:
        # tol=0 asks for exactly max_iter iterations (the paper's fixed T).
        return
    if deadline is not None and time.monotonic() > deadline:
        return
    history, quantity = result.loss_history, "min-loss"
    change = abs(history[-2] - history[-1]) / max(abs(history[-2]), np.finfo(float).tiny)
    how = "relative"
    if isinstance(result, EMResult) and result.log_likelihood_history:
        history, quantity = result.log_likelihood_history, "mean log-likelihood per row"
        change, how = abs(history[-2] - history[-1]), "absolute"
    what = {
        "auto": "the polish of the best candidate by classical AM",
        "em": "EM",
        "am-classic": "classical AM",
    }.get(algorithm, "gradient AM")
    advice = f"raise max_iter (now {max_iter})"
    if algorithm in ("am", "subsample+am") and params.get("step_size") != "auto":
        advice += ", or use step_size='auto'"
    elif algorithm == "em":
        advice += f" or tol (now {params['tol']:g})"
    warnings.warn(
        f"{what} stopped at max_iter={max_iter} before converging: the {quantity} still changed "
        f"by {change:.2g} ({how}) in the last iteration, above tol={params['tol']:g}; "
        f"{advice}",
        ConvergenceWarning,
        stacklevel=3,
    )


class MixtureOfLinearRegressions(BaseEstimator):  # type: ignore[misc]
    """Mixture of k linear regressions with list-decoded predictions.

    Fits k lines ``y ~ <x, coef_j> + intercept_j`` that minimise the min-loss
    ``(1/n) sum_i min_j (y_i - <x_i, coef_j> - intercept_j)^2`` (no generative model assumed) and
    predicts, for each row, the list of the k lines' values.

    Internally every feature and y are centred on their means (with an intercept) and
    scaled, then the data are scaled as in the paper (max row norm of X and max |y| equal 1,
    with a constant column for the intercept), so ``step_size`` keeps the paper's meaning and
    every algorithm is equivariant under shifts and scalings of the features and of y; fitted
    lines are reported in the caller's units. Every least-squares solve is centred per part,
    as ``LinearRegression``'s.

    Parameters
    ----------
    n_components : int, default=2
        The number of lines k.
    algorithm : {"auto", "subsample+am", "am", "am-classic", "subsample", \
"subsample-exhaustive", "em"}, default="auto"
        - ``"auto"`` (default): the best of many, searched until it stops improving.
          Candidate line sets come from ``n_init`` random starts (least-squares lines of random
          partitions and of random small sets of rows), the paper's A3, EM restarts and
          Algorithm 3 with RANSAC, each polished by classical AM (which never increases its
          min-loss). Then rounds of moves from the best: a line that fits its rows badly split
          in two while a slot is freed by dropping or merging lines, a line moved to where the
          others fit worst (rows drawn by their squared residual, as k-means++ does), and a line
          replaced by a fresh one; the rounds stop after 3 in a row that improved the best
          min-loss by a relative 1e-4 or less. Batches of fresh random starts, each with its own
          rounds, follow while they improve the best (the search stops after 2 that did not).
          Without a ``time_budget`` the rounds and restarts also stop at a cap on their work
          that grows with the rows, features and k searched (about 5 s of one core on small
          data, at most about 40 s); the cap counts multiply-adds, not seconds, so the result
          depends on the seed only. On more than 20,000 rows the search runs on a sample of
          20,000 rows, and the best candidates are polished again on all rows: at least three,
          and every one whose sample min-loss is within two standard errors of the best's
          (at most eight). ``candidates_`` records them all. With one line, least squares on
          all rows is the exact answer and the only candidate. With ``groups`` the search
          starts with grouped EM from ``n_init`` random partitions of the groups (at most 10),
          each polished by grouped classical AM, and stops there when half of them (two at
          least) reach the best min-loss (within a relative 1e-6); otherwise the sources,
          rounds and restarts above follow.
        - ``"am"``: Algorithm 1, gradient AM from Gaussian random lines (or ``init``).
        - ``"am-classic"``: AM with an exact least-squares refit per part, started from the lines
          of a random partition of the rows (``n_init`` starts run as one batch).
        - ``"subsample"``: Algorithm 3, ``n_partitions`` random partitions of a sub-sample of
          ``subsample_size`` rows, a least-squares or RANSAC line per part, the best candidate on
          all rows, refitted on the rows each line wins.
        - ``"subsample-exhaustive"``: Algorithm 2, every partition of the sub-sample.
        - ``"subsample+am"``: the paper's A3, Algorithm 3 then Algorithm 1 from its lines.
        - ``"em"``: EM for a Gaussian mixture of regressions (per-line weight and noise variance),
          started like flexmix from a random partition of the rows.
    fit_intercept : bool, default=True
    random_state : None, int, numpy.random.Generator or RandomState
        The single source of randomness of a fit.
    step_size : float or "auto", default="auto"
        The paper's gamma (``am``, ``subsample+am``). ``"auto"`` moves each line within the
        span of its gradient in whitened coordinates (the features' inverse Gram matrix times
        the gradient) and its previous step, to the point that minimizes its objective on its
        current rows, so the min-loss never increases and Algorithm 1 converges in about the
        paper's T = 50 steps whatever the units of the features; a number keeps the paper's
        exact update
        ``theta_j -= (gamma / n) sum_{i in S_j} grad F_i(theta_j)``.
    max_iter : int, default=100 (200 for ``em``)
        The paper's T (``am``, ``am-classic``, ``subsample+am``, ``em``); for ``auto``, the
        classical AM iterations of each candidate's polish.
    tol : float, default=1e-6
        Stop when the relative change of the min-loss between iterations is at most ``tol``;
        for ``em``, when the mean log-likelihood per row changes by at most ``tol``.
    n_init : int, default=1 (size-aware for ``auto``)
        Random starts (``am``, ``am-classic``, ``em``); the lowest training min-loss is kept
        (for ``em``, the highest log-likelihood).
        For ``auto``, the number of random starts of the first round, from 100 on small data
        down to 4 on large data (``n_init // 4`` EM restarts, at most 10, run beside them);
        each later batch of restarts has ``n_init`` starts too, at most 20. With groups, the
        grouped EM starts come first (at most 10, see ``algorithm``).
    init : array-like of shape (n_components, n_features + fit_intercept), optional
        Starting lines: coefficients then intercept, in the caller's units (``am``,
        ``am-classic``, ``em``); for ``auto``, one more candidate, polished and searched
        around like the others (a warm start from yesterday's lines; a k sweep gives each k
        the (k - 1)-line fit plus one line this way).
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
        iterative algorithms return their current lines; ``auto`` skips the sources it has
        no time left for, stops its rounds and restarts at the budget instead of at its work
        cap (so a budget above the cap lets the search go on while it still improves), and
        returns the best candidate so far, polished where it is. At least one batch, step or
        source runs. A fit with a time budget depends on the machine's speed and load, not only
        on the seed: how many candidates fit in the budget does.
    standard_errors : bool, default=False
        Also compute standard errors from the observed information of the Gaussian mixture
        of regressions at its maximum-likelihood fit (``coef_se_`` and the other ``*_se_``
        attributes, :meth:`summary`, :meth:`confidence_intervals`): the highest maximum EM
        reaches from the fitted lines and from 10 random partitions of the rows, as flexmix's
        ``stepFlexmix(nrep = 10)`` starts (``ml_start_`` says which won). It costs EM on a
        sample of at most 20,000 rows, an EM polish of one to three starts and one pass of
        products over the rows. For a gated fit, those of the gated mixture (lines, noise
        variances and the gate's free rows, ``gate_coef_se_`` and ``gate_intercept_se_``) at
        the maximum that Newton's method reaches from gated EM's fit; sample weights and
        groups are not taken with a gate.
    gating : bool, default=False
        Whether the mixing probabilities depend on each row (flexmix's ``FLXPmultinom``
        concomitant model): ``pi_j(z) = softmax_j(<z, gate_coef_j> + gate_intercept_j)``, with
        z the features, or the ``concomitant`` columns given to :meth:`fit`. The lines found by
        ``algorithm`` (the lowest min-loss) start EM for the gated Gaussian mixture of
        regressions, whose M-step fits the lines by weighted least squares, their noise
        variances, and the gate's multinomial logit (first component as reference) by a
        warm-started Newton method; EM stops when the mean log-likelihood per row changes by at
        most 1e-8, after 1,000 iterations, or at the time budget. Gated EM also starts from the
        best of 5 (ungated) EM restarts from random partitions of the rows, as flexmix starts,
        and the start that ends with the higher likelihood is kept: the lowest min-loss lines
        need not lie near the likelihood's highest maximum. The fitted lines are then the
        gated mixture's. With sample weights every step of it is weighted (a row of weight w
        counts as w copies of itself, in the gate's Newton steps too). Without a gate nothing
        of the above runs.

    Attributes
    ----------
    coef_ : ndarray of shape (n_components, n_features)
    intercept_ : ndarray of shape (n_components,)
    shares_ : ndarray of shape (n_components,)
        Fraction of training rows each line predicts best (of their total weight, with
        sample weights; with groups, each row counts for its group's line). Components are
        ordered by share, largest first; equal shares by the line's value at the mean of the
        training features, largest first, then by coefficients (:func:`component_order`).
        Every output that lists lines (standard errors, summaries, bootstrap replicates, each
        k of a sweep) uses this order.
    loss_history_ : ndarray
        Training min-loss per iteration (AM, EM) or best candidate per batch of partitions
        followed by the loss after the refit (sub-sample algorithms); for ``subsample+am`` the
        search's history followed by AM's.
    n_iter_ : int
        Iterations run (AM, EM; for ``auto``, the classical AM iterations of the chosen
        candidate's polish), or candidate line sets tried (``subsample``,
        ``subsample-exhaustive``).
    n_candidates_ : int
        Candidate line sets tried (sub-sample algorithms; 0 otherwise).
    converged_ : bool
        Whether the fit stopped by its own rule: ``tol`` or a fixed point (iterative
        algorithms and the polish of ``auto``), every partition tried (sub-sample
        algorithms). False when ``max_iter`` or the time budget stopped it.
    train_loss_ : float
        Training min-loss of the fitted lines (weighted, and grouped, as the fit was).
    weights_, noise_variance_ : ndarray of shape (n_components,)
        For ``em``, a gated fit, a grouped ``auto`` fit and every algorithm with
        ``standard_errors=True``: the mixture weights (for a gated fit, the mean gate
        probability of each line over the training rows) and per-line noise variances
        (caller's units); with ``standard_errors`` or ``auto``, those of the
        maximum-likelihood fit below.
    ml_coef_, ml_intercept_ : ndarray of shape (n_components, n_features), (n_components,)
        Only with ``standard_errors=True``, or after an ``auto`` fit with groups: the
        maximum-likelihood fit of the Gaussian mixture of regressions, the estimates the
        standard errors belong to (not the served min-loss lines): with
        ``standard_errors=True`` the highest maximum EM reaches from the fitted lines and from
        random partitions of the rows (:mod:`mixreg._likelihood`), each line matched to its
        min-loss line's index. With groups it is grouped EM's (each group's rows from one
        line), run to EM's tolerance (1e-6), or the search's best EM start when that ends
        higher (its lines matched to the fitted ones), so its likelihood is at least that of
        ``em`` with the same seed and ``n_init`` (at most 10). For ``em`` they are ``coef_`` and
        ``intercept_`` run to a tighter tolerance; for the min-loss algorithms they are close
        to the fitted lines when the lines are well separated (see ADR 0021).
    ml_start_ : {"min-loss lines", "em restart"}
        Only with ``standard_errors=True`` (no gate): where EM started that reached
        ``ml_coef_``: the fitted lines, or a random partition of the rows.
    coef_se_, intercept_se_, weights_se_, noise_variance_se_ : ndarray
        Only with ``standard_errors=True``: standard errors of ``ml_coef_``,
        ``ml_intercept_``, ``weights_`` and ``noise_variance_`` from the observed information
        (as ``flexmix::refit``); NaN when the information is singular (a warning says so).
    covariance_ : ndarray of shape (k * (n_features + fit_intercept + 1) + k,) * 2
        Only with ``standard_errors=True``: their joint covariance, per line its coefficients,
        intercept and noise variance, then the k weights; for a gated fit, after the lines the
        gate's free rows (components 1..k-1), each its slopes then its intercept, in place of
        the weights (of shape ``k * (n_features + fit_intercept + 1) + (k - 1) *
        (n_concomitant + 1)``).
    gate_coef_se_, gate_intercept_se_ : ndarray
        Of shapes (n_components, n_concomitant) and (n_components,). Only for a gated fit
        with ``standard_errors=True``: standard errors of ``gate_coef_`` and
        ``gate_intercept_`` (zero for the reference, the first component, fixed at zero);
        ``weights_se_`` is then NaN (the weights are the gate's mean probabilities).
    gate_coef_ : ndarray of shape (n_components, n_concomitant)
        Only for a gated fit: the gate's slopes on the raw concomitant columns (the features
        when no ``concomitant`` was given); the first row, the reference, is zero.
    gate_intercept_ : ndarray of shape (n_components,)
        Only for a gated fit; the first is zero.
    log_likelihood_ : float
        Only for a gated fit, with ``standard_errors=True``, or after an ``auto`` fit with
        groups: the gated mixture's total log-likelihood of the training rows (weighted by
        ``sample_weight``), or the maximum-likelihood fit's (with groups, the sum over the
        groups of the log of each group's mixture density).
    bic_ : float
        Only for a gated fit: ``-2 log_likelihood_ + n_parameters log(n_samples)`` with
        ``n_parameters`` counting every line's coefficients and intercept, its noise variance
        and the ``(n_components - 1) * (n_concomitant + 1)`` free parameters of the gate;
        with sample weights ``n_samples`` is their total.
    log_likelihood_history_ : ndarray
        Only for a gated fit: gated EM's mean log-likelihood per row (per unit of weight) at
        every iteration.
    gate_n_iter_ : int
    gate_converged_ : bool
        Only for a gated fit: gated EM's iterations, and whether it stopped by its tolerance
        (not by its iteration cap or the time budget).
    gate_start_ : {"lines", "em restart"}
        Only for a gated fit: where the kept gated EM started (see ``gating``).
    gate_on_features_ : bool
        Only for a gated fit: whether the gate reads the features (no ``concomitant``).
    n_concomitant_in_ : int
        Only for a gated fit: the gate's number of columns.
    n_features_in_ : int
    group_labels_ : ndarray of shape (n_groups,)
        Only after a fit with ``groups``: the distinct training groups, sorted (groups whose
        rows all weigh zero are left out).
    group_line_ : ndarray of shape (n_groups,)
        Only after a fit with ``groups``: the line of each of ``group_labels_``.
    group_posterior_ : ndarray of shape (n_groups, n_components)
        Only after an ``em`` fit with ``groups``: each group's posterior over the lines.
    candidates_ : list of dict
        Only for ``auto``: every candidate tried, in order, with its ``source``, its training
        min-loss before and after polishing (``min_loss_before``, ``min_loss_after``, caller's
        units, on the ``n_rows`` it was polished on), ``seconds``, ``n_iter`` and
        ``converged``.

    Warns
    -----
    ConvergenceWarning
        When an iterative algorithm (or the polish of ``auto``'s chosen candidate) stops at
        ``max_iter`` before converging, with what to change; not when ``tol=0``, which asks
        for exactly ``max_iter`` iterations, nor when the time budget stopped it.

    Notes
    -----
    A line that wins no training rows is never refitted on an empty set: AM leaves it where
    it is (its gradient is zero), classical AM and the sub-sample refit keep its previous
    value, EM floors its weight and variance. It keeps a share of 0 and finite coefficients.
    """

    def __init__(
        self,
        n_components: int = 2,
        algorithm: str = "auto",
        fit_intercept: bool = True,
        random_state: Any = None,
        step_size: float | str | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        n_init: int | None = None,
        init: ArrayLike | None = None,
        subsample_size: int | None = None,
        n_partitions: int | None = None,
        base: str | None = None,
        time_budget: float | None = None,
        standard_errors: bool = False,
        gating: bool = False,
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
        self.standard_errors = standard_errors
        self.gating = gating

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
        if not isinstance(self.standard_errors, bool | np.bool_):
            raise ValueError(f"standard_errors must be True or False; got {self.standard_errors!r}")
        if not isinstance(self.gating, bool | np.bool_):
            raise ValueError(f"gating must be True or False; got {self.gating!r}")
        given = {name: getattr(self, name) for name in PARAMETER_NAMES}
        params = resolve_parameters(
            algorithm,
            given,
            n_components=int(self.n_components),
            n_samples=n_samples,
            n_params=n_features + bool(self.fit_intercept),
        )
        if algorithm == "auto" and params["n_init"] is None:
            params["n_init"] = default_n_init(
                n_samples, n_features + bool(self.fit_intercept), int(self.n_components)
            )
        if algorithm == "subsample-exhaustive":
            k = int(self.n_components)
            largest = largest_enumerable_size(
                k, MAX_EXHAUSTIVE_PARTITIONS, limit=DEFAULT_EXHAUSTIVE_SIZE_LIMIT
            )
            if params["subsample_size"] is None:
                params["subsample_size"] = largest
            size = params["subsample_size"]
            if capped_stirling2(size, k, MAX_EXHAUSTIVE_PARTITIONS) > MAX_EXHAUSTIVE_PARTITIONS:
                raise ValueError(
                    f"subsample-exhaustive would try more than {MAX_EXHAUSTIVE_PARTITIONS:,} "
                    f"partitions (the cap) of subsample_size={size} rows into {k} parts; use "
                    f"subsample_size <= {largest}, or algorithm='subsample', which tries "
                    f"n_partitions random partitions"
                )
        return params

    def fit(
        self,
        X: ArrayLike,
        y: ArrayLike | None = None,
        sample_weight: ArrayLike | None = None,
        groups: ArrayLike | None = None,
        *,
        progress: ProgressCallback | None = None,
        concomitant: ArrayLike | None = None,
    ) -> MixtureOfLinearRegressions:
        """Fit the k lines (and, with ``gating``, the gate).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), ChunkSource or dask collection
            Rows in memory, or rows read in chunks by every pass of a streamed fit
            (:mod:`mixreg._streamed`: a :class:`~mixreg.ArrayChunks`,
            :class:`~mixreg.NpyChunks` holding y and the weights, or a dask array or DataFrame
            with dask ``y`` and ``sample_weight``; ``algorithm="auto"`` without groups, gate
            or standard errors).
        y : array-like of shape (n_samples,)
            Required unless ``X`` is a ChunkSource.
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative row weights, read as replication weights (as flexmix's): every
            algorithm minimizes or maximizes the weighted objective (weighted min-loss
            ``(1/W) sum_i w_i min_j r_ij^2`` with ``W = sum_i w_i``, weighted likelihood for
            EM), its scaling statistics and least-squares fits are weighted, and the
            sub-sample and random-row draws pick a row with probability proportional to its
            weight. From the same start, an integer weight gives the lines that many copies of
            the row give, and a zero weight the lines without the row (zero-weight rows are
            dropped first). Where a random algorithm draws rows (``subsample``,
            ``subsample+am``, the sources of ``auto``, RANSAC's minimal subsets) a weighted fit
            is not the same random draw as one on repeated rows, so the two agree only from the
            same drawn start. Equal weights fit as no weights.
        groups : array-like of shape (n_samples,), optional
            A hashable label per row; every row of a group is assigned to the same line. The
            min-loss becomes ``(1/W) sum_g min_j sum_{i in g} w_i r_ij^2``; ``am-classic``
            assigns whole groups, ``em`` gives each group a posterior (the product of its rows'
            likelihoods) and ``auto`` starts from grouped EM fits, polishes every candidate by
            grouped classical AM and moves whole groups (it also reports the
            maximum-likelihood mixture: ``ml_coef_``, ``weights_``, ``noise_variance_``,
            ``log_likelihood_``). Other algorithms raise ValueError. With one row per group
            the lines are the ungrouped fit's.
        progress : callable, optional
            ``progress(fraction, info)`` is called as the fit advances, with ``info`` holding
            ``iteration``, ``candidates_tried`` and ``best_loss`` (training min-loss so far, in
            the caller's units; ``None`` where not applicable). An exception raised by it stops
            the fit and propagates.
        concomitant : array-like of shape (n_samples, n_concomitant), optional
            The columns the gate reads instead of the features (``gating=True`` only).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Naming ``sample_weight`` (negative, NaN or infinite weights, wrong length, every
            weight zero) or ``groups`` (wrong length, a missing label, an algorithm that does
            not fit groups), or the parameter that is wrong.
        """
        source = streamed_source(X, y, sample_weight, groups, concomitant)
        if source is not None:
            # Rows read in chunks (a ChunkSource, dask arrays): every pass streams them.
            return fit_streamed(self, source, progress=progress)
        if y is None:
            raise ValueError("y: the targets are required (only a ChunkSource X holds them)")
        started = time.monotonic()
        X_arr, y_arr = check_X_y(X, y)
        weights = None if sample_weight is None else check_sample_weight(sample_weight, len(y_arr))
        group_labels: NDArray[Any] | None = None
        codes: NDArray[np.intp] | None = None
        if concomitant is not None and not self.gating:
            raise ValueError(
                "concomitant columns were given but gating=False: set gating=True to let the "
                "mixing probabilities depend on them"
            )
        gate_columns = (
            None if concomitant is None else check_concomitant(concomitant, n_samples=len(y_arr))
        )
        if groups is not None:
            if self.algorithm not in GROUPED_ALGORITHMS:
                raise ValueError(
                    f"groups: algorithm={self.algorithm!r} does not fit groups; use one of "
                    f"{', '.join(repr(name) for name in GROUPED_ALGORITHMS)}"
                )
            if self.standard_errors:
                raise ValueError(
                    "groups: standard errors are computed for ungrouped rows only; fit with "
                    "standard_errors=False"
                )
            group_labels, codes = check_groups(groups, len(y_arr))
        if weights is not None:
            kept = weights > 0
            if not kept.all():
                # A row of weight zero is a row that is not there.
                X_arr, y_arr, weights = X_arr[kept], y_arr[kept], weights[kept]
                if gate_columns is not None:
                    gate_columns = gate_columns[kept]
                if codes is not None and group_labels is not None:
                    present, codes = np.unique(codes[kept], return_inverse=True)
                    group_labels, codes = group_labels[present], codes.ravel()
            if np.all(weights == weights[0]):
                weights = None
        grouping = None if codes is None else Grouping.of(codes)
        n_samples, n_features = X_arr.shape
        params = self.resolved_parameters(n_samples, n_features)
        if self.gating and grouping is not None:
            raise ValueError("groups: a gated fit takes no groups")
        if self.gating and weights is not None and self.standard_errors:
            raise ValueError(
                "standard_errors: a gated fit with sample weights has no standard errors; "
                "leave out one of them"
            )
        for name in (*_GATE_ATTRIBUTES, *_MIXTURE_ATTRIBUTES):
            if hasattr(self, name):
                delattr(self, name)
        scaling, Z, y_scaled = _Scaling.of(X_arr, y_arr, bool(self.fit_intercept), weights)
        if params.get("init") is not None:
            params["init"] = scaling.to_scaled(params["init"])
        budget = params.get("time_budget")
        ctx = FitContext(
            Z=Z,
            y=y_scaled,
            n_components=int(self.n_components),
            n_features=n_features,
            params=params,
            rng=as_generator(self.random_state),
            deadline=None if budget is None else started + budget,
            started=started,
            loss_scale=scaling.y_scale**2,
            progress=progress,
            sample_weight=weights,
            grouping=grouping,
        )
        with single_threaded_blas():
            result = _SOLVERS[self.algorithm](ctx)
            if _ends_in_least_squares(self.algorithm):
                before = result.loss
                result.theta = refit_exactly_until_stable(
                    ctx.Z,
                    ctx.y,
                    result.theta,
                    deadline=ctx.deadline,
                    sample_weight=weights,
                    grouping=grouping,
                )
                after = _scaled_loss(ctx, result.theta)
                if after < before * (1.0 - 1e-9):
                    result.loss_history = [*result.loss_history, after]
            mixture = None
            if isinstance(result, AutoResult) and grouping is not None:
                mixture = grouped_mixture(ctx, result.theta, result.em_restart)
            gate = None
            if self.gating:
                gate = _fit_gate(ctx, X_arr if gate_columns is None else gate_columns, result.theta)
                if self.standard_errors:
                    _finish_gate(ctx, gate)
                result.theta = gate.em.theta

        coef, intercept = scaling.to_caller(result.theta)
        _, labels = assign_many(
            ctx.Z, ctx.y, result.theta[None], sample_weight=weights, grouping=grouping
        )
        row_weight = np.ones(n_samples) if weights is None else weights
        shares = np.bincount(labels[0], weights=row_weight, minlength=ctx.n_components).astype(
            np.float64
        ) / float(row_weight.sum())
        rows_per_line = np.bincount(labels[0], minlength=ctx.n_components)
        order = component_order(coef, intercept, shares, weighted_mean(X_arr.T, weights))
        self.coef_ = coef[order]
        self.intercept_ = intercept[order]
        self.shares_ = shares[order]
        self.loss_history_ = _in_caller_units(result.loss_history, ctx.loss_scale)
        self.train_loss_ = weighted_min_loss(
            y_arr, predict_lines(X_arr, self.coef_, self.intercept_), weights, grouping
        )
        self.n_iter_ = result.n_iter
        self.n_candidates_ = result.n_candidates
        self.converged_ = result.converged
        self.n_features_in_ = n_features
        if isinstance(result, EMResult):
            assert result.weights is not None and result.variances is not None
            self.weights_ = result.weights[order]
            self.noise_variance_ = _in_caller_units(result.variances[order], ctx.loss_scale)
        if mixture is not None:
            self._set_mixture(mixture, order, scaling, n_samples if weights is None else weights)
        if isinstance(result, AutoResult):
            self.candidates_ = [
                candidate.to_dict(ctx.loss_scale) for candidate in result.candidates
            ]
        for grouped_attribute in ("group_labels_", "group_line_", "group_posterior_"):
            if hasattr(self, grouped_attribute):
                delattr(self, grouped_attribute)
        if grouping is not None and group_labels is not None:
            self._set_groups(ctx, result, group_labels, labels[0], order)
        if gate is not None:
            self._set_gate(gate, order, ctx, scaling, on_features=gate_columns is None)
        _warn_if_unconverged(self.algorithm, result, params, ctx.deadline)
        _warn_if_degenerate(rows_per_line[order].astype(np.float64), ctx.Z.shape[1])
        for name in _GATE_STANDARD_ERRORS:
            if hasattr(self, name):
                delattr(self, name)
        if self.standard_errors:
            with single_threaded_blas():
                if gate is None:
                    self._set_standard_errors(
                        ctx.Z, ctx.y, result.theta[order], scaling, ctx.sample_weight, ctx.rng
                    )
                else:
                    self._set_gate_standard_errors(gate, order, ctx, scaling)
        ctx.report(
            1.0,
            iteration=result.n_iter,
            candidates=result.n_candidates or None,
            # In scaled units: train_loss_ / loss_scale is 0 / 0 when y_scale**2 underflows.
            loss=_scaled_loss(ctx, result.theta),
        )
        return self

    def _set_mixture(
        self,
        mixture: EMResult,
        order: NDArray[np.intp],
        scaling: _Scaling,
        observations: int | FloatArray,
    ) -> None:
        """The maximum-likelihood mixture of a grouped ``auto`` fit (scaled, each line at its
        min-loss line's index) in the output order and the caller's units; ``observations``
        is the number of rows, or their weights."""
        assert mixture.weights is not None and mixture.variances is not None
        assert mixture.log_likelihood_history
        coef, intercept = scaling.to_caller(mixture.theta)
        self.ml_coef_, self.ml_intercept_ = coef[order], intercept[order]
        self.weights_ = mixture.weights[order]
        self.noise_variance_ = _in_caller_units(mixture.variances[order], scaling.y_scale**2)
        # The density of y in the caller's units is the scaled one over y_scale, row by row.
        total = float(np.sum(observations))
        self.log_likelihood_ = total * (
            mixture.log_likelihood_history[-1] - float(np.log(scaling.y_scale))
        )

    def _set_groups(
        self,
        ctx: FitContext,
        result: SolverResult,
        group_labels: NDArray[Any],
        row_lines: NDArray[np.intp],
        order: NDArray[np.intp],
    ) -> None:
        """The fitted groups: their labels, each one's line and, for EM, its posterior."""
        assert ctx.grouping is not None
        position = np.argsort(order)
        group_line = np.zeros(ctx.grouping.n_groups, dtype=np.intp)
        group_line[ctx.grouping.codes] = position[row_lines]
        self.group_labels_ = group_labels
        self.group_line_ = group_line
        if isinstance(result, EMResult):
            assert result.weights is not None and result.variances is not None
            expectation = e_step(
                ctx.Z,
                ctx.y,
                result.theta[None],
                result.weights[None],
                result.variances[None],
                sample_weight=ctx.sample_weight,
                grouping=ctx.grouping,
            )
            self.group_posterior_ = expectation.unit_posteriors[0][order].T

    def _set_standard_errors(
        self,
        Z: FloatArray,
        y: FloatArray,
        theta: FloatArray,
        scaling: _Scaling,
        sample_weight: FloatArray | None,
        rng: np.random.Generator,
    ) -> None:
        """The maximum-likelihood fit at the highest maximum found from ``theta`` (scaled
        lines, in the output order), EM restarts and flexmix-like random partitions
        (:func:`~mixreg._likelihood.best_maximum_likelihood`), and its standard errors, in the
        caller's units; rows count ``sample_weight`` times."""
        fit = best_maximum_likelihood(Z, y, theta, rng=rng, sample_weight=sample_weight)
        params = fit.params
        evaluated = (
            likelihood_pass(Z, y, params, sample_weight=sample_weight)
            if fit.at_maximum is None
            else fit.at_maximum
        )
        variance_scale = scaling.y_scale**2
        coef, intercept = scaling.to_caller(params.theta)
        self.ml_coef_, self.ml_intercept_ = coef, intercept
        self.ml_start_ = fit.start
        self.weights_ = params.weights
        self.noise_variance_ = _in_caller_units(params.variances, variance_scale)
        # The density of y in the caller's units is the scaled one over y_scale, row by row.
        n_observations = y.size if sample_weight is None else float(sample_weight.sum())
        self.log_likelihood_ = evaluated.log_likelihood - n_observations * np.log(scaling.y_scale)
        jacobian = caller_jacobian(params, scaling.line_jacobian(), variance_scale)
        self.covariance_ = self._covariance_or_nan(evaluated.information, jacobian)
        k = coef.shape[0]
        n_line = theta.shape[1] + 1
        se = np.sqrt(np.maximum(np.diag(self.covariance_), 0.0))
        self._set_line_standard_errors(se[: k * n_line].reshape(k, n_line))
        self.weights_se_ = se[k * n_line :]

    def _set_gate_standard_errors(
        self, gate: _GatedFit, order: NDArray[np.intp], ctx: FitContext, scaling: _Scaling
    ) -> None:
        """Standard errors of a gated fit (its lines, noise variances and gate, at the maximum
        :func:`_finish_gate` reached) from the gated mixture's observed information, in the
        caller's units; the mixture weights, the gate's mean probabilities, have none."""
        beta = gate.em.beta[order]
        params = GatedParameters(
            theta=gate.em.theta[order], variances=gate.em.variances[order], beta=beta - beta[0]
        )
        evaluated = gated_likelihood_pass(ctx.Z, ctx.y, gate.design, params)
        self.ml_coef_, self.ml_intercept_ = self.coef_, self.intercept_
        variance_scale = scaling.y_scale**2
        jacobian = gated_caller_jacobian(
            params, scaling.line_jacobian(), variance_scale, gate.scaling
        )
        self.covariance_ = self._covariance_or_nan(evaluated.information, jacobian)
        k, n_params = params.theta.shape
        n_line = n_params + 1
        se = np.sqrt(np.maximum(np.diag(self.covariance_), 0.0))
        self._set_line_standard_errors(se[: k * n_line].reshape(k, n_line))
        self.weights_se_ = np.full(k, np.nan)
        # The reference row is fixed at zero: no error.
        by_row = np.zeros((k, gate.design.shape[1]))
        by_row[1:] = se[k * n_line :].reshape(k - 1, gate.design.shape[1])
        self.gate_coef_se_ = by_row[:, :-1]
        self.gate_intercept_se_ = by_row[:, -1]

    def _covariance_or_nan(self, information: FloatArray, jacobian: FloatArray) -> FloatArray:
        """The covariance in the caller's units, or NaN (with a warning) where the observed
        information is singular."""
        scaled_covariance = covariance_from_information(information)
        if scaled_covariance is None:
            warnings.warn(
                "the observed information of the mixture is singular at its maximum-likelihood "
                "fit (a line owns almost no rows, or two lines coincide): its standard errors "
                "do not exist and are NaN; fit fewer lines (n_components)",
                StandardErrorWarning,
                stacklevel=3,
            )
            return np.full((jacobian.shape[0],) * 2, np.nan)
        covariance: FloatArray = jacobian @ scaled_covariance @ jacobian.T
        return covariance

    def _set_line_standard_errors(self, by_line: FloatArray) -> None:
        """Each line's coefficients', intercept's and noise variance's errors, from the rows
        of ``by_line`` (per line: coefficients, intercept when fitted, noise variance)."""
        n_features = self.n_features_in_
        self.coef_se_ = by_line[:, :n_features]
        self.intercept_se_ = (
            by_line[:, n_features] if self.fit_intercept else np.zeros(by_line.shape[0])
        )
        self.noise_variance_se_ = by_line[:, -1]

    def _check_standard_errors(self) -> None:
        self._check_fitted()
        if not hasattr(self, "coef_se_"):
            raise NotFittedError(
                "This MixtureOfLinearRegressions has no standard errors; fit it with "
                "standard_errors=True."
            )

    def confidence_intervals(self, level: float = 0.95) -> dict[str, FloatArray]:
        """Wald intervals ``estimate -/+ z_(1+level)/2 * se`` of the maximum-likelihood fit.

        Returns
        -------
        intervals : dict
            ``coef`` of shape (n_components, n_features, 2), ``intercept``, ``weights`` and
            ``noise_variance`` of shape (n_components, 2): lower and upper bounds (NaN where
            the standard error does not exist: the weights of a gated fit, its gate's mean
            probabilities, have none). A gated fit adds ``gate_coef`` of shape
            (n_components, n_concomitant, 2) and ``gate_intercept`` of shape
            (n_components, 2); the reference component's are (0, 0).
        """
        self._check_standard_errors()
        critical = normal_quantile(check_level(level))
        pairs = {
            "coef": (self.ml_coef_, self.coef_se_),
            "intercept": (self.ml_intercept_, self.intercept_se_),
            "weights": (self.weights_, self.weights_se_),
            "noise_variance": (self.noise_variance_, self.noise_variance_se_),
        }
        if hasattr(self, "gate_coef_se_"):
            pairs["gate_coef"] = (self.gate_coef_, self.gate_coef_se_)
            pairs["gate_intercept"] = (self.gate_intercept_, self.gate_intercept_se_)
        return {
            name: np.stack([estimate - critical * se, estimate + critical * se], axis=-1)
            for name, (estimate, se) in pairs.items()
        }

    def summary(
        self,
        level: float = 0.95,
        feature_names: Sequence[str] | None = None,
        concomitant_names: Sequence[str] | None = None,
    ) -> InferenceSummary:
        """Per line, estimate, std. error, z value, Pr(>|z|) and interval of every coefficient
        (as R's ``summary(refit(m))``), then of its weight and noise variance; for a gated fit
        also the gate's rows (``gate_rows``), as R lists a concomitant model. ``str()`` of the
        result prints it as R does. ``concomitant_names`` names the columns of a gate fitted
        on ``concomitant`` (a gate on the features takes ``feature_names``)."""
        self._check_standard_errors()
        names = (
            [f"x{column}" for column in range(self.n_features_in_)]
            if feature_names is None
            else [str(name) for name in feature_names]
        )
        if len(names) != self.n_features_in_:
            raise ValueError(
                f"feature_names has {len(names)} names for {self.n_features_in_} features"
            )
        table = summary_table(
            feature_names=names,
            fit_intercept=bool(self.fit_intercept),
            coef=self.ml_coef_,
            intercept=self.ml_intercept_,
            weights=self.weights_,
            noise_variance=self.noise_variance_,
            coef_se=self.coef_se_,
            intercept_se=self.intercept_se_,
            weights_se=self.weights_se_,
            noise_variance_se=self.noise_variance_se_,
            level=check_level(level),
            log_likelihood=float(self.log_likelihood_),
        )
        if not hasattr(self, "gate_coef_se_"):
            return replace(table, start=getattr(self, "ml_start_", None))
        n_columns = self.gate_coef_.shape[1]
        if self.gate_on_features_:
            gate_names = names
        elif concomitant_names is None:
            gate_names = [f"z{column}" for column in range(n_columns)]
        else:
            gate_names = [str(name) for name in concomitant_names]
        if len(gate_names) != n_columns:
            raise ValueError(
                f"concomitant_names has {len(gate_names)} names for the gate's {n_columns} columns"
            )
        return replace(
            table,
            gate_rows=gate_summary_rows(
                concomitant_names=gate_names,
                gate_coef=self.gate_coef_,
                gate_intercept=self.gate_intercept_,
                gate_coef_se=self.gate_coef_se_,
                gate_intercept_se=self.gate_intercept_se_,
                level=table.level,
            ),
        )

    def bootstrap(
        self,
        X: ArrayLike,
        y: ArrayLike,
        n_bootstrap: int = 200,
        kind: str = "parametric",
        random_state: Any = None,
        level: float = 0.95,
        progress: ProgressCallback | None = None,
    ) -> BootstrapResult:
        """Bootstrap standard errors and percentile intervals of the maximum-likelihood fit.

        The fitted lines are polished to the maximum-likelihood fit (as for
        ``standard_errors``); each of ``n_bootstrap`` replicates (``kind="parametric"``: new
        targets drawn from that mixture at the same rows; ``"empirical"``: rows drawn with
        replacement) is refitted by EM from it, and its lines are matched to the fitted ones by
        the Hungarian assignment on their parameters, so line j of every replicate is line j.

        Parameters
        ----------
        X, y : the training data
        progress : callable, optional
            ``progress(fraction, info)`` after every replicate (``info["iteration"]`` is the
            number of replicates done); an exception raised by it stops the bootstrap.

        Returns
        -------
        BootstrapResult
            Also kept as ``bootstrap_``.
        """
        self._check_fitted()
        if (
            isinstance(n_bootstrap, bool)
            or not isinstance(n_bootstrap, numbers.Integral)
            or n_bootstrap < 2
        ):
            raise ValueError(f"n_bootstrap must be an integer >= 2; got {n_bootstrap!r}")
        level = check_level(level)
        X_arr, y_arr = check_X_y(X, y)
        check_X(X_arr, n_features=self.n_features_in_)
        scaling, Z, y_scaled = _Scaling.of(X_arr, y_arr, bool(self.fit_intercept))
        lines = np.column_stack([self.coef_, self.intercept_]) if self.fit_intercept else self.coef_
        with single_threaded_blas():
            if hasattr(self, "ml_coef_") and hasattr(self, "ml_start_"):
                # The maximum-likelihood fit the standard errors belong to, polished again on
                # these rows.
                ml_lines = (
                    np.column_stack([self.ml_coef_, self.ml_intercept_])
                    if self.fit_intercept
                    else self.ml_coef_
                )
                fitted = maximum_likelihood_polish(
                    Z,
                    y_scaled,
                    scaling.to_scaled(ml_lines),
                    weights=self.weights_,
                    variances=self.noise_variance_ / scaling.y_scale**2,
                ).params
            else:
                fitted = best_maximum_likelihood(
                    Z, y_scaled, scaling.to_scaled(lines), rng=as_generator(random_state)
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
                n_bootstrap=int(n_bootstrap),
                kind=kind,
                rng=as_generator(random_state),
                progress=report,
            )
        k, n_params = fitted.theta.shape
        coef, intercept = scaling.to_caller(replicates.theta.reshape(-1, n_params))
        self.bootstrap_ = BootstrapResult.of(
            kind=kind,
            level=level,
            coef=coef.reshape(int(n_bootstrap), k, -1),
            intercept=intercept.reshape(int(n_bootstrap), k),
            weights=replicates.weights,
            noise_variance=_in_caller_units(replicates.variances, scaling.y_scale**2),
            converged=replicates.converged,
        )
        return self.bootstrap_

    def _set_gate(
        self,
        gate: _GatedFit,
        order: NDArray[np.intp],
        ctx: FitContext,
        scaling: _Scaling,
        *,
        on_features: bool,
    ) -> None:
        """The gated fit's attributes, components in the estimator's order."""
        beta = gate.em.beta[order]
        # The softmax is unchanged by a common shift: the first component becomes the reference.
        beta -= beta[0]
        n_gate_params = gate.design.shape[1]
        n_observations = float(
            gate.design.shape[0] if ctx.sample_weight is None else ctx.sample_weight.sum()
        )
        k = beta.shape[0]
        self.gate_coef_, self.gate_intercept_ = gate.scaling.to_caller(beta)
        self.weights_ = weighted_mean(np.exp(log_gate(gate.design, beta)).T, ctx.sample_weight)
        self.noise_variance_ = _in_caller_units(gate.em.variances[order], ctx.loss_scale)
        # The density of y is that of the scaled target divided by the scale.
        self.log_likelihood_history_ = np.asarray(gate.em.log_likelihood_history) - float(
            np.log(scaling.y_scale)
        )
        self.log_likelihood_ = float(n_observations * self.log_likelihood_history_[-1])
        n_parameters = gate_parameter_count(k, ctx.Z.shape[1], n_gate_params - 1)
        self.bic_ = -2.0 * self.log_likelihood_ + n_parameters * float(np.log(n_observations))
        self.gate_n_iter_ = gate.em.n_iter
        self.gate_converged_ = gate.em.converged
        self.gate_start_ = gate.start
        self.gate_on_features_ = on_features
        self.n_concomitant_in_ = n_gate_params - 1

    def to_dict(
        self,
        feature_names: Sequence[str] | None = None,
        concomitant_names: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The fitted lines as a JSON-ready document (plain numbers and names, never pickle)
        that :meth:`from_dict` reads back to the same predictions, bit for bit.

        Parameters
        ----------
        feature_names : sequence of str, optional
            One name per feature; default ``x0, x1, ...``.
        concomitant_names : sequence of str, optional
            One name per concomitant column of a gate fitted on ``concomitant``; default
            ``z0, z1, ...``.

        Returns
        -------
        document : dict
            ``format`` (``"mixreg-model"``), ``format_version``, ``n_components``,
            ``n_features``, ``feature_names``, ``fit_intercept``, ``coef`` (k lists of d
            numbers), ``intercept`` and ``shares`` (k numbers), ``gate`` (None without a gate;
            else ``concomitant`` — None when the gate reads the features, else the column
            names —, ``coef`` (k lists of q numbers), ``intercept``, ``noise_variance`` (k
            numbers), ``log_likelihood``, ``bic``), ``algorithm`` and ``params`` (the
            estimator's JSON-representable parameters).
        """
        self._check_fitted()
        gate = None
        if hasattr(self, "gate_coef_"):
            gate = gate_document(
                coef=self.gate_coef_,
                intercept=self.gate_intercept_,
                noise_variance=self.noise_variance_,
                log_likelihood=self.log_likelihood_,
                bic=self.bic_,
                concomitant_names=None
                if self.gate_on_features_
                else (
                    concomitant_names
                    if concomitant_names is not None
                    else [f"z{j}" for j in range(self.n_concomitant_in_)]
                ),
            )
        params = {
            name: value
            for name, value in self.get_params().items()
            if name not in ("n_components", "algorithm", "fit_intercept", "gating")
            and (value is None or isinstance(value, str | int | float | bool | np.ndarray | list))
        }
        return lines_document(
            coef=self.coef_,
            intercept=self.intercept_,
            shares=self.shares_,
            fit_intercept=bool(self.fit_intercept),
            feature_names=feature_names,
            algorithm=str(self.algorithm),
            params=params,
            gate=gate,
        )

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> MixtureOfLinearRegressions:
        """A fitted estimator with the lines of a :meth:`to_dict` document (members that the
        document may carry besides, such as a service's metrics, are ignored).

        Raises
        ------
        ValueError
            Naming what the document lacks or holds wrong.
        """
        lines = read_lines(document)
        params = {name: value for name, value in lines["params"].items() if name in PARAMETER_NAMES}
        estimator = cls(
            n_components=int(lines["coef"].shape[0]),
            algorithm=lines["algorithm"],
            fit_intercept=lines["fit_intercept"],
            random_state=lines["params"].get("random_state"),
            gating=lines["gate"] is not None,
            **params,
        )
        estimator.coef_ = lines["coef"]
        estimator.intercept_ = lines["intercept"]
        estimator.shares_ = lines["shares"]
        estimator.n_features_in_ = int(lines["coef"].shape[1])
        gate = lines["gate"]
        if gate is not None:
            estimator.gate_coef_ = gate["coef"]
            estimator.gate_intercept_ = gate["intercept"]
            estimator.noise_variance_ = gate["noise_variance"]
            estimator.log_likelihood_ = gate["log_likelihood"]
            estimator.bic_ = gate["bic"]
            estimator.gate_on_features_ = gate["concomitant"] is None
            estimator.n_concomitant_in_ = int(gate["coef"].shape[1])
        return estimator

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(
                "This MixtureOfLinearRegressions is not fitted yet; call fit(X, y) first."
            )

    def _gate_columns(self, X: FloatArray, Z: ArrayLike | None) -> FloatArray:
        """The columns the gate reads for rows ``X``: the features, or the checked ``Z``."""
        if not hasattr(self, "gate_coef_"):
            raise ValueError(
                "this model has no gate: fit it with gating=True for mixing probabilities "
                "that depend on each row"
            )
        if self.gate_on_features_:
            if Z is not None:
                raise ValueError(
                    "this model's gate reads the features: pass no concomitant columns (Z)"
                )
            return X
        if Z is None:
            raise ValueError(
                f"this model's gate reads {self.n_concomitant_in_} concomitant columns: pass "
                f"them as Z"
            )
        return check_concomitant(Z, n_samples=X.shape[0], n_columns=self.n_concomitant_in_)

    def _lines_and_gate(self, X: ArrayLike, Z: ArrayLike | None) -> tuple[FloatArray, FloatArray]:
        """Every line's value (n, k) and the log mixing probabilities (n, k) of rows X."""
        self._check_fitted()
        X_arr = check_X(X, n_features=self.n_features_in_)
        columns = self._gate_columns(X_arr, Z)
        log_probabilities = log_softmax(columns @ self.gate_coef_.T + self.gate_intercept_)
        return predict_lines(X_arr, self.coef_, self.intercept_), log_probabilities

    def predict_proba(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The gate's mixing probabilities of every line for every row (gated models).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        Z : array-like of shape (n_samples, n_concomitant), optional
            The concomitant columns, when the gate was fitted on them.

        Returns
        -------
        probabilities : ndarray of shape (n_samples, n_components)
            Rows sum to 1.
        """
        _, log_probabilities = self._lines_and_gate(X, Z)
        return np.exp(log_probabilities)

    def predict_expected(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The gate-weighted mean of the k lines' values: ``sum_j pi_j(z) <x, coef_j> + b_j``.

        Returns
        -------
        expected : ndarray of shape (n_samples,)
        """
        values, log_probabilities = self._lines_and_gate(X, Z)
        expected: FloatArray = np.einsum("ij,ij->i", values, np.exp(log_probabilities))
        return expected

    def most_likely_component(self, X: ArrayLike, Z: ArrayLike | None = None) -> NDArray[np.intp]:
        """Index of the line of largest mixing probability for each row (ties to the lowest)."""
        _, log_probabilities = self._lines_and_gate(X, Z)
        most_likely: NDArray[np.intp] = np.argmax(log_probabilities, axis=1)
        return most_likely

    def predict_most_likely(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The value of each row's most likely line (see :meth:`most_likely_component`).

        Returns
        -------
        most_likely : ndarray of shape (n_samples,)
        """
        values, log_probabilities = self._lines_and_gate(X, Z)
        chosen = np.argmax(log_probabilities, axis=1)
        most_likely: FloatArray = values[np.arange(values.shape[0]), chosen]
        return most_likely

    def gated_log_likelihood(
        self,
        X: ArrayLike,
        y: ArrayLike,
        Z: ArrayLike | None = None,
        sample_weight: ArrayLike | None = None,
    ) -> float:
        """Total log-likelihood of (X, y) under the gated mixture (held-out rows, for instance).

        ``sum_i w_i log sum_j pi_j(z_i) N(y_i; <x_i, coef_j> + intercept_j, noise_variance_j)``,
        with every ``w_i = 1`` without ``sample_weight``.
        """
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        X_arr = check_X(X_arr, n_features=self.n_features_in_)
        columns = self._gate_columns(X_arr, Z)
        ones = np.ones((X_arr.shape[0], 1))
        _, row_log_likelihood = gated_log_densities(
            np.hstack([X_arr, ones]),
            y_arr,
            np.hstack([columns, ones]),
            np.column_stack([self.coef_, self.intercept_]),
            self.noise_variance_,
            np.column_stack([self.gate_coef_, self.gate_intercept_]),
        )
        if sample_weight is None:
            return float(row_log_likelihood.sum())
        return float(row_log_likelihood @ check_sample_weight(sample_weight, len(y_arr)))

    def predict(self, X: ArrayLike) -> FloatArray:
        """List-decoded predictions: one column per line.

        Returns
        -------
        predictions : ndarray of shape (n_samples, n_components)
        """
        self._check_fitted()
        X_arr = check_X(X, n_features=self.n_features_in_)
        return predict_lines(X_arr, self.coef_, self.intercept_)

    def min_loss(
        self,
        X: ArrayLike,
        y: ArrayLike,
        sample_weight: ArrayLike | None = None,
        groups: ArrayLike | None = None,
    ) -> float:
        """The paper's min-loss of the fitted lines on (X, y).

        With ``sample_weight``, ``(1/W) sum_i w_i min_j r_ij^2``; with ``groups``, each
        group takes its own best line: ``(1/W) sum_g min_j sum_{i in g} w_i r_ij^2``.
        """
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        if sample_weight is None and groups is None:
            return float(row_min_losses(y_arr, predictions).mean())
        weights = None if sample_weight is None else check_sample_weight(sample_weight, len(y_arr))
        grouping = None if groups is None else Grouping.of(check_groups(groups, len(y_arr))[1])
        return weighted_min_loss(y_arr, predictions, weights, grouping)

    def predict_group(self, groups: ArrayLike) -> NDArray[np.intp]:
        """The line of each training group, -1 for a group not seen in training.

        Parameters
        ----------
        groups : array-like of shape (n_samples,)
            Group labels, of the type given to :meth:`fit`.

        Returns
        -------
        lines : ndarray of shape (n_samples,)
        """
        self._check_fitted()
        if not hasattr(self, "group_line_"):
            raise NotFittedError("This MixtureOfLinearRegressions was not fitted with groups.")
        labels = np.asarray(groups)
        if labels.ndim != 1:
            raise ValueError(f"groups must be 1-dimensional; got shape {labels.shape}")
        try:
            at = np.searchsorted(self.group_labels_, labels)
        except TypeError as exc:
            raise ValueError(
                f"groups must be labels of the type the model was fitted with: {exc}"
            ) from None
        inside = at < self.group_labels_.size
        known = np.zeros(labels.shape[0], dtype=bool)
        known[inside] = self.group_labels_[at[inside]] == labels[inside]
        lines: NDArray[np.intp] = np.where(
            known, self.group_line_[np.where(known, at, 0)], -1
        ).astype(np.intp)
        return lines

    def best_component(self, X: ArrayLike, y: ArrayLike) -> NDArray[np.intp]:
        """Index of the line that predicts each row best (ties to the lowest index)."""
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        best: NDArray[np.intp] = np.argmin(np.abs(predictions - y_arr[:, None]), axis=1)
        return best
