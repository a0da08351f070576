"""EM for a Gaussian mixture of linear regressions (the soft counterpart of AM)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._am import SolverResult, StepCallback, assign_many
from ._loss import Grouping, weighted_mean
from ._lstsq import WeightedLeastSquares

FloatArray = NDArray[np.float64]

# Variances are floored at this fraction of var(y) (plus a tiny absolute floor) so a component
# that fits a handful of rows exactly cannot send the likelihood to infinity.
_VARIANCE_FLOOR = 1e-8
_WEIGHT_FLOOR = 1e-12
# A line whose responsibilities sum to less than this many rows is treated as empty.
_EMPTY_MASS = 1e-9


@dataclass
class EMResult(SolverResult):
    """EM's lines plus the mixture weights, per-line noise variances and log-likelihoods."""

    weights: FloatArray | None = None
    variances: FloatArray | None = None
    log_likelihood_history: list[float] | None = None


@dataclass(frozen=True)
class EStep:
    """What an E-step gives, for many starts at once."""

    responsibilities: FloatArray
    """Shape (n_starts, n_components, n_samples): each row's posterior (its group's when
    grouped)."""
    log_likelihood: FloatArray
    """Shape (n_starts,): log-likelihood per unit of weight (per row without weights)."""
    min_loss: FloatArray
    """Shape (n_starts,): the lines' (weighted, grouped) min-loss."""
    mixing: FloatArray | None
    """Shape (n_starts, n_components): with groups, the mean of the groups' posteriors (the
    M-step's mixture weights); None otherwise (the M-step takes them from the rows)."""
    unit_posteriors: FloatArray
    """Shape (n_starts, n_components, n_units): posterior of every row, or every group."""


def e_step(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    weights: FloatArray,
    variances: FloatArray,
    *,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
    squared_residuals: FloatArray | None = None,
) -> EStep:
    """Responsibilities of every line for every row, for many starts at once.

    A row of weight ``w`` counts as ``w`` copies of itself: its density enters the
    log-likelihood ``w`` times. With groups, a group's posterior is that of all its rows
    drawn from one line: the product of its rows' densities (a sum in log space), times the
    line's weight.

    Parameters
    ----------
    theta : ndarray of shape (n_starts, n_components, n_params)
    weights, variances : ndarray of shape (n_starts, n_components)
        Mixture weights and noise variances.
    sample_weight : ndarray of shape (n_samples,), optional
    grouping : Grouping, optional
    squared_residuals : ndarray of shape (n_starts, n_components, n_samples), optional
        The squared residuals of ``theta``, when the caller has them (the M-step that fitted
        ``theta`` computed them for the variances).
    """
    n_starts, n_components, n_params = theta.shape
    if squared_residuals is None:
        squared_residuals = (theta.reshape(-1, n_params) @ Z.T).reshape(n_starts, n_components, -1)
        np.subtract(y, squared_residuals, out=squared_residuals)
        np.square(squared_residuals, out=squared_residuals)
    total_weight = Z.shape[0] if sample_weight is None else float(sample_weight.sum())
    if grouping is None:
        log_prob = (np.log(weights) - 0.5 * np.log(2.0 * np.pi * variances))[
            :, :, None
        ] - squared_residuals / (2.0 * variances)[:, :, None]
        min_loss = weighted_mean(squared_residuals.min(axis=1), sample_weight)
    else:
        # A group's log-density on a line needs only its rows' (weighted) count and sum of
        # squared residuals; the same sums give the grouped min-loss.
        if sample_weight is None:
            group_weight = grouping.sizes().astype(np.float64)
            group_squared = grouping.sum(squared_residuals)
        else:
            group_weight = grouping.sum(sample_weight)
            group_squared = grouping.sum(squared_residuals * sample_weight)
        log_prob = (
            np.log(weights)[:, :, None]
            - 0.5 * np.log(2.0 * np.pi * variances)[:, :, None] * group_weight
            - group_squared / (2.0 * variances)[:, :, None]
        )
        min_loss = group_squared.min(axis=1).sum(axis=1) / total_weight
    top = log_prob[:, 0].copy()
    for component in range(1, n_components):
        np.maximum(top, log_prob[:, component], out=top)
    log_prob -= top[:, None, :]
    np.exp(log_prob, out=log_prob)
    total = log_prob.sum(axis=1)
    log_prob /= total[:, None, :]
    log_norm = top + np.log(total)
    if grouping is None:
        log_likelihood = weighted_mean(log_norm, sample_weight)
        return EStep(log_prob, log_likelihood, min_loss, None, log_prob)
    return EStep(
        responsibilities=log_prob[:, :, grouping.codes],
        log_likelihood=log_norm.sum(axis=1) / total_weight,
        min_loss=min_loss,
        mixing=log_prob.mean(axis=2),
        unit_posteriors=log_prob,
    )


def m_step(
    Z: FloatArray,
    y: FloatArray,
    responsibilities: FloatArray,
    previous_theta: FloatArray,
    variance_floor: float,
    *,
    sample_weight: FloatArray | None = None,
    mixing: FloatArray | None = None,
    solver: WeightedLeastSquares | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Weighted least squares per line, then the weights and noise variances (many starts).

    Each row's responsibility is multiplied by its sample weight. The mixture weights are
    ``mixing`` when given (the groups' mean posterior), else each line's share of the
    responsibility mass. A line with (numerically) no responsibility mass keeps its previous
    value rather than collapsing to the zero line.

    ``solver`` is a :class:`~mixreg._lstsq.WeightedLeastSquares` of ``Z`` and ``y`` kept
    across iterations (one is made when omitted). Returns the lines, weights and variances,
    then the squared residuals of the new lines (the next E-step's).
    """
    n_starts, n_components, n_samples = responsibilities.shape
    n_params = Z.shape[1]
    if sample_weight is not None:
        responsibilities = responsibilities * sample_weight
    mass = responsibilities.sum(axis=2)
    if solver is None:
        solver = WeightedLeastSquares(Z, y)
    fitted = solver.solve(responsibilities.reshape(-1, n_samples)).reshape(
        n_starts, n_components, n_params
    )
    theta = np.where((mass > _EMPTY_MASS)[:, :, None], fitted, previous_theta)
    residuals = (theta.reshape(-1, n_params) @ Z.T).reshape(n_starts, n_components, -1)
    np.subtract(y, residuals, out=residuals)
    np.square(residuals, out=residuals)
    variances = np.einsum("skn,skn->sk", responsibilities, residuals) / np.maximum(
        mass, np.finfo(np.float64).tiny
    )
    variances = np.maximum(variances, variance_floor)
    if mixing is None:
        total_weight = n_samples if sample_weight is None else float(sample_weight.sum())
        mixing = mass / total_weight
    weights = np.maximum(mixing, _WEIGHT_FLOOR)
    return theta, weights / weights.sum(axis=1, keepdims=True), variances, residuals


def initial_parameters(
    Z: FloatArray,
    y: FloatArray,
    thetas: FloatArray,
    variance_floor: float,
    *,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Weights and variances that go with given lines: from the hard partition they induce.

    ``thetas`` has shape (n_starts, n_components, n_params); the results have shape
    (n_starts, n_components). A line without rows gets the start's overall mean squared
    residual.
    """
    squared, labels = assign_many(Z, y, thetas, sample_weight=sample_weight, grouping=grouping)
    n_starts, n_components, _ = thetas.shape
    row_weight = np.ones(Z.shape[0]) if sample_weight is None else sample_weight
    # One bincount for every start's lines: bin (start, line).
    bins = (np.arange(n_starts)[:, None] * n_components + labels).ravel()
    size = n_starts * n_components
    counts = np.bincount(bins, weights=np.tile(row_weight, n_starts), minlength=size)
    sums = np.bincount(bins, weights=(row_weight * squared).ravel(), minlength=size)
    counts, sums = counts.reshape(n_starts, n_components), sums.reshape(n_starts, n_components)
    overall = weighted_mean(squared, sample_weight)[:, None]
    variances = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), overall)
    variances = np.maximum(variances, variance_floor)
    weights = np.maximum(counts / counts.sum(axis=1, keepdims=True), _WEIGHT_FLOOR)
    return weights / weights.sum(axis=1, keepdims=True), variances


def default_variance_floor(y: FloatArray, sample_weight: FloatArray | None = None) -> float:
    """EM's smallest noise variance of a line: a tiny fraction of the (weighted) ``var(y)``."""
    if sample_weight is None:
        spread = float(np.var(y))
    else:
        centred = y - weighted_mean(y, sample_weight)
        spread = float(weighted_mean(centred * centred, sample_weight))
    return _VARIANCE_FLOOR * max(spread, 0.0) + 1e-300


@dataclass
class EMBatchResult:
    """EM's lines, weights and variances for many starts, each run to its own stop."""

    thetas: FloatArray
    weights: FloatArray
    variances: FloatArray
    loss_histories: list[list[float]]
    log_likelihood_histories: list[list[float]]
    n_iter: NDArray[np.intp]
    converged: NDArray[np.bool_]

    def start(self, index: int) -> EMResult:
        """The fit of start ``index``."""
        return EMResult(
            theta=self.thetas[index],
            loss_history=self.loss_histories[index],
            n_iter=int(self.n_iter[index]),
            converged=bool(self.converged[index]),
            weights=self.weights[index],
            variances=self.variances[index],
            log_likelihood_history=self.log_likelihood_histories[index],
        )


def em_batch(
    Z: FloatArray,
    y: FloatArray,
    thetas: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
    variance_floor: float | None = None,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
    solver: WeightedLeastSquares | None = None,
    start_weights: FloatArray | None = None,
    start_variances: FloatArray | None = None,
) -> EMBatchResult:
    """EM from many starts at once; each stops when its log-likelihood settles.

    Every iteration of all the starts still running is one E-step and one M-step over
    stacked arrays; a start leaves the batch when its mean log-likelihood per row changes by at
    most ``tol``.

    Parameters
    ----------
    thetas : ndarray of shape (n_starts, n_components, n_params)
    callback : callable, optional
        Called after every iteration with (iteration, smallest min-loss of the running starts).
    variance_floor : float, optional
        Smallest noise variance of a line; by default a tiny fraction of ``var(y)``.
    sample_weight : ndarray of shape (n_samples,), optional
        Positive row weights (a row of weight ``w`` counts as ``w`` copies).
    grouping : Grouping, optional
        Rows of a group share one line: posteriors are the groups'.
    solver : WeightedLeastSquares, optional
        Of ``Z`` and ``y``, when the caller keeps one (one is made when omitted).
    start_weights, start_variances : ndarray of shape (n_starts, n_components), optional
        The starts' mixing weights and noise variances (both or neither; variances are
        floored); by default those of the hard partition the lines induce
        (:func:`initial_parameters`).
    """
    thetas = np.array(thetas, dtype=np.float64)
    n_starts = thetas.shape[0]
    if variance_floor is None:
        variance_floor = default_variance_floor(y, sample_weight)
    if start_weights is None or start_variances is None:
        weights, variances = initial_parameters(
            Z, y, thetas, variance_floor, sample_weight=sample_weight, grouping=grouping
        )
    else:
        weights = np.array(start_weights, dtype=np.float64)
        variances = np.maximum(np.array(start_variances, dtype=np.float64), variance_floor)
    losses: list[list[float]] = [[] for _ in range(n_starts)]
    likelihoods: list[list[float]] = [[] for _ in range(n_starts)]
    n_iter = np.zeros(n_starts, dtype=np.intp)
    converged = np.zeros(n_starts, dtype=bool)
    active = np.arange(n_starts)
    if solver is None:
        solver = WeightedLeastSquares(Z, y)
    # The M-step's squared residuals of its new lines are the next E-step's.
    squared: FloatArray | None = None
    for iteration in range(max_iter + 1):
        expectation = e_step(
            Z,
            y,
            thetas[active],
            weights[active],
            variances[active],
            sample_weight=sample_weight,
            grouping=grouping,
            squared_residuals=squared,
        )
        responsibilities, log_likelihood = expectation.responsibilities, expectation.log_likelihood
        mixing, loss = expectation.mixing, expectation.min_loss
        settled = np.zeros(active.size, dtype=bool)
        for position, start in enumerate(active.tolist()):
            if iteration > 0:
                # An absolute change of the mean log-likelihood per row (as scikit-learn's
                # GaussianMixture): its value can be near zero, so a relative one means little.
                settled[position] = abs(log_likelihood[position] - likelihoods[start][-1]) <= tol
            likelihoods[start].append(float(log_likelihood[position]))
            losses[start].append(float(loss[position]))
        if iteration > 0 and callback is not None:
            callback(iteration, float(loss.min()))
        converged[active[settled]] = True
        keep = ~settled
        active, responsibilities = active[keep], responsibilities[keep]
        out_of_time = deadline is not None and time.monotonic() > deadline
        if active.size == 0 or iteration == max_iter or out_of_time:
            break
        thetas[active], weights[active], variances[active], squared = m_step(
            Z,
            y,
            responsibilities,
            thetas[active],
            variance_floor,
            sample_weight=sample_weight,
            mixing=None if mixing is None else mixing[keep],
            solver=solver,
        )
        n_iter[active] += 1
    return EMBatchResult(
        thetas=thetas,
        weights=weights,
        variances=variances,
        loss_histories=losses,
        log_likelihood_histories=likelihoods,
        n_iter=n_iter,
        converged=converged,
    )


def em(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
    solver: WeightedLeastSquares | None = None,
    variance_floor: float | None = None,
    start_weights: FloatArray | None = None,
    start_variances: FloatArray | None = None,
) -> EMResult:
    """Fit a Gaussian mixture of regressions by EM, starting from the given lines.

    Model: ``y | z ~ sum_j w_j N(<z, theta_j>, sigma_j^2)``. Stops when the mean
    log-likelihood per row changes by at most ``tol`` or after ``max_iter`` iterations. A line whose
    weight collapses keeps finite parameters (weights and variances are floored).
    ``sample_weight``, ``grouping``, ``solver`` and ``variance_floor`` as in :func:`em_batch`;
    ``start_weights`` and ``start_variances`` (shape (n_components,)) start EM from a whole
    mixture instead of the partition the lines induce.

    Returns
    -------
    EMResult
        ``loss_history`` holds the min-loss of the lines after each iteration.
    """
    batch = em_batch(
        Z,
        y,
        theta[None],
        max_iter=max_iter,
        tol=tol,
        deadline=deadline,
        callback=callback,
        sample_weight=sample_weight,
        grouping=grouping,
        solver=solver,
        variance_floor=variance_floor,
        start_weights=None if start_weights is None else np.asarray(start_weights)[None],
        start_variances=None if start_variances is None else np.asarray(start_variances)[None],
    )
    return batch.start(0)
