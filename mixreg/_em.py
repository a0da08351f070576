"""EM for a Gaussian mixture of linear regressions (the soft counterpart of AM)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._am import Evaluation, SolverResult, StepCallback, run_iterations
from ._loss import assign
from ._lstsq import lstsq_weighted

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


def e_step(
    Z: FloatArray, y: FloatArray, theta: FloatArray, weights: FloatArray, variances: FloatArray
) -> tuple[FloatArray, float, FloatArray]:
    """Responsibilities of every line for every row.

    Returns
    -------
    responsibilities : ndarray of shape (n_components, n_samples)
    log_likelihood : float
        Mean log-likelihood per row.
    residuals : ndarray of shape (n_components, n_samples)
    """
    residuals = y - theta @ Z.T
    log_prob = (np.log(weights) - 0.5 * np.log(2.0 * np.pi * variances))[
        :, None
    ] - residuals * residuals / (2.0 * variances)[:, None]
    top = log_prob.max(axis=0)
    log_norm = top + np.log(np.exp(log_prob - top).sum(axis=0))
    responsibilities = np.exp(log_prob - log_norm)
    return responsibilities, float(log_norm.mean()), residuals


def m_step(
    Z: FloatArray,
    y: FloatArray,
    responsibilities: FloatArray,
    previous_theta: FloatArray,
    variance_floor: float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted least squares per line, then the weights and noise variances.

    A line with (numerically) no responsibility mass keeps its previous value rather than
    collapsing to the zero line.
    """
    mass = responsibilities.sum(axis=1)
    theta = np.where(
        (mass > _EMPTY_MASS)[:, None], lstsq_weighted(Z, y, responsibilities), previous_theta
    )
    residuals = y - theta @ Z.T
    variances = np.einsum("kn,kn->k", responsibilities, residuals * residuals) / np.maximum(
        mass, np.finfo(np.float64).tiny
    )
    variances = np.maximum(variances, variance_floor)
    weights = np.maximum(mass / Z.shape[0], _WEIGHT_FLOOR)
    return theta, weights / weights.sum(), variances


def initial_parameters(
    Z: FloatArray, y: FloatArray, theta: FloatArray, variance_floor: float
) -> tuple[FloatArray, FloatArray]:
    """Weights and variances that go with given lines: from the hard partition they induce."""
    residuals, labels = assign(Z, y, theta)
    n_components = theta.shape[0]
    best = residuals[labels, np.arange(Z.shape[0])]
    counts = np.bincount(labels, minlength=n_components).astype(np.float64)
    squared = np.bincount(labels, weights=best * best, minlength=n_components)
    overall = float(np.mean(best * best))
    variances = np.where(counts > 0, squared / np.maximum(counts, 1.0), overall)
    variances = np.maximum(variances, variance_floor)
    weights = np.maximum(counts / counts.sum(), _WEIGHT_FLOOR)
    return weights / weights.sum(), variances


def em(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
) -> EMResult:
    """Fit a Gaussian mixture of regressions by EM, starting from the given lines.

    Model: ``y | z ~ sum_j w_j N(<z, theta_j>, sigma_j^2)``. Stops when the relative change of
    the mean log-likelihood is at most ``tol`` or after ``max_iter`` iterations. A line whose
    weight collapses keeps finite parameters (weights and variances are floored).

    Returns
    -------
    EMResult
        ``loss_history`` holds the min-loss of the lines after each iteration.
    """
    variance_floor = _VARIANCE_FLOOR * max(float(np.var(y)), 0.0) + 1e-300
    weights, variances = initial_parameters(Z, y, theta, variance_floor)
    log_likelihoods: list[float] = []
    responsibilities = np.empty(0)

    def evaluate() -> Evaluation:
        nonlocal responsibilities
        responsibilities, log_likelihood, residuals = e_step(Z, y, theta, weights, variances)
        log_likelihoods.append(log_likelihood)
        loss = float(np.mean(np.min(residuals * residuals, axis=0)))
        return Evaluation(loss=loss, criterion=log_likelihood)

    def update() -> None:
        nonlocal theta, weights, variances
        theta, weights, variances = m_step(Z, y, responsibilities, theta, variance_floor)

    trace = run_iterations(
        evaluate, update, max_iter=max_iter, tol=tol, deadline=deadline, callback=callback
    )
    return EMResult(
        theta=theta,
        loss_history=trace.loss_history,
        n_iter=trace.n_iter,
        converged=trace.converged,
        weights=weights,
        variances=variances,
        log_likelihood_history=log_likelihoods,
    )
