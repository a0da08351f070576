"""The gate: x-dependent mixing probabilities, and EM for the gated mixture of regressions.

A gated mixture of k lines (flexmix's ``FLXPmultinom`` concomitant model) says

    y | x, z  ~  sum_j pi_j(z) N(<x, theta_j>, sigma_j^2),
    pi(z) = softmax(beta_1 . w, ..., beta_k . w),   w = (standardized z, 1),

with the first class as the reference (``beta_1 = 0``, as flexmix's multinomial logit): the
other k - 1 rows of ``beta`` are free. EM alternates the posterior responsibilities of the
lines (E-step) with weighted least squares per line, its noise variance and the gate's
multinomial logit fitted to the responsibilities (M-step). The gate's M-step is a warm-started
Newton method with a backtracking line search on all k - 1 free rows at once; every step that it
takes lowers the gate's objective, so the M-step never lowers the log-likelihood (a generalized
EM) and the log-likelihood never decreases from one iteration to the next.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._em import initial_parameters
from ._lstsq import WeightedLeastSquares

FloatArray = NDArray[np.float64]

# Newton steps per M-step, warm-started from the previous iteration's gate: the gate moves
# little between EM iterations, so a few steps reach its optimum (and one is enough for EM to
# climb).
_NEWTON_STEPS = 2
# The gate's optimum is reached when its gradient (mean per row) is this small.
_GRADIENT_TOL = 1e-10
# Added to the Hessian's diagonal, relative to its largest entry, so that a singular Hessian
# (a class with vanishing probability, collinear concomitant columns) still gives a direction.
# It changes the step, never the objective: the line search still checks the real objective.
_HESSIAN_DAMPING = 1e-9
_ARMIJO = 1e-4
_HALVINGS = 40
# A line whose responsibilities sum to less than this many rows keeps its previous value.
_EMPTY_MASS = 1e-9


@dataclass(frozen=True)
class GateScaling:
    """Concomitant variables centred and scaled to unit spread, then a constant column."""

    mean: FloatArray
    scale: FloatArray

    @classmethod
    def of(cls, concomitant: FloatArray) -> tuple[GateScaling, FloatArray]:
        """The scaling of the concomitant matrix (n, q) and its design (n, q + 1)."""
        mean = concomitant.mean(axis=0)
        spread = concomitant.std(axis=0)
        spread[spread <= np.finfo(np.float64).tiny] = 1.0
        scaling = cls(mean=mean, scale=spread)
        return scaling, scaling.design(concomitant)

    def design(self, concomitant: FloatArray) -> FloatArray:
        """Standardized concomitant columns followed by the constant column."""
        W = np.empty((concomitant.shape[0], self.mean.size + 1))
        np.subtract(concomitant, self.mean, out=W[:, :-1])
        W[:, :-1] /= self.scale
        W[:, -1] = 1.0
        return W

    def to_caller(self, beta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Gate rows in standardized units to (coef (k, q), intercept (k,)) on raw columns."""
        coef = beta[:, :-1] / self.scale
        intercept = beta[:, -1] - coef @ self.mean
        return coef, intercept


def log_softmax(logits: FloatArray) -> FloatArray:
    """Row-wise log-softmax of (n, k) logits, without overflow."""
    top = logits.max(axis=1, keepdims=True)
    shifted: FloatArray = logits - top
    shifted -= np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return shifted


def log_gate(W: FloatArray, beta: FloatArray) -> FloatArray:
    """Log mixing probabilities (n, k) of design rows ``W`` (n, p) under gate ``beta`` (k, p)."""
    return log_softmax(W @ beta.T)


def gate_objective(W: FloatArray, responsibilities: FloatArray, beta: FloatArray) -> float:
    """Mean negative expected log-probability of the classes: the gate's M-step objective.

    Parameters
    ----------
    W : ndarray of shape (n_samples, n_gate_params)
    responsibilities : ndarray of shape (n_samples, n_components)
        Rows sum to 1.
    beta : ndarray of shape (n_components, n_gate_params)
    """
    return _objective(responsibilities, log_gate(W, beta))


def _objective(responsibilities: FloatArray, log_probabilities: FloatArray) -> float:
    total = float(np.einsum("ij,ij->", responsibilities, log_probabilities))
    return -total / int(log_probabilities.shape[0])


def gate_gradient(W: FloatArray, responsibilities: FloatArray, beta: FloatArray) -> FloatArray:
    """Gradient of :func:`gate_objective` with respect to the free rows ``beta[1:]``.

    Returns
    -------
    gradient : ndarray of shape (n_components - 1, n_gate_params)
        ``(1/n) sum_i (pi_ij - r_ij) w_i`` for every free class j.
    """
    return _gradient(W, responsibilities, np.exp(log_gate(W, beta)))


def _gradient(W: FloatArray, responsibilities: FloatArray, probabilities: FloatArray) -> FloatArray:
    gradient: FloatArray = (probabilities - responsibilities)[:, 1:].T @ W / W.shape[0]
    return gradient


def gate_hessian(W: FloatArray, beta: FloatArray) -> FloatArray:
    """Hessian of :func:`gate_objective` in the free rows, flattened class-major.

    Block (j, l) is ``(1/n) sum_i pi_ij (delta_jl - pi_il) w_i w_i^T``; it does not depend on
    the responsibilities (their rows sum to 1). With ``a_i = (pi_i1 w_i, ..., pi_i(k-1) w_i)``
    it is ``blockdiag_j(sum_i pi_ij w_i w_i^T) - sum_i a_i a_i^T``: two matrix products.

    Returns
    -------
    hessian : ndarray of shape ((n_components - 1) * p, (n_components - 1) * p)
    """
    return _hessian(W, np.exp(log_gate(W, beta)))


def _hessian(W: FloatArray, probabilities: FloatArray) -> FloatArray:
    n_samples, p = W.shape
    free = probabilities.shape[1] - 1
    weighted = (probabilities[:, 1:, None] * W[:, None, :]).reshape(n_samples, free * p)
    hessian: FloatArray = -(weighted.T @ weighted)
    diagonal = (weighted.T @ W).reshape(free, p, p)
    for j in range(free):
        hessian[j * p : (j + 1) * p, j * p : (j + 1) * p] += diagonal[j]
    hessian /= n_samples
    return hessian


def gate_m_step(
    W: FloatArray,
    responsibilities: FloatArray,
    beta: FloatArray,
    *,
    max_steps: int = _NEWTON_STEPS,
) -> FloatArray:
    """Fit the gate to the responsibilities by Newton's method, warm-started at ``beta``.

    Each step solves the (slightly damped) Newton system for all free rows at once and halves
    it until the objective falls by Armijo's rule, so the result is never worse than ``beta``.
    The reference row ``beta[0]`` stays zero.

    Parameters
    ----------
    W : ndarray of shape (n_samples, p)
    responsibilities : ndarray of shape (n_samples, n_components)
    beta : ndarray of shape (n_components, p)
        With ``beta[0] == 0``.

    Returns
    -------
    beta : ndarray of shape (n_components, p)
    """
    beta = np.array(beta, dtype=np.float64)
    if beta.shape[0] == 1:
        return beta
    beta, _ = _newton(W, responsibilities, beta, log_gate(W, beta), max_steps)
    return beta


def _newton(
    W: FloatArray,
    responsibilities: FloatArray,
    beta: FloatArray,
    log_probabilities: FloatArray,
    max_steps: int,
) -> tuple[FloatArray, FloatArray]:
    """:func:`gate_m_step` from ``beta`` and its log-probabilities (``log_gate(W, beta)``);
    returns the new gate with its log-probabilities (the next E-step's)."""
    objective = _objective(responsibilities, log_probabilities)
    for _ in range(max_steps):
        probabilities = np.exp(log_probabilities)
        gradient = _gradient(W, responsibilities, probabilities).ravel()
        if np.max(np.abs(gradient)) <= _GRADIENT_TOL:
            break
        hessian = _hessian(W, probabilities)
        hessian[np.diag_indices_from(hessian)] += _HESSIAN_DAMPING * max(
            float(np.max(np.diag(hessian))), np.finfo(np.float64).tiny
        )
        try:
            direction = np.linalg.solve(hessian, gradient)
        except np.linalg.LinAlgError:
            direction = gradient
        slope = float(gradient @ direction)
        step = 1.0
        for _ in range(_HALVINGS):
            trial = beta.copy()
            trial[1:] -= step * direction.reshape(beta.shape[0] - 1, -1)
            trial_log_probabilities = log_gate(W, trial)
            trial_objective = _objective(responsibilities, trial_log_probabilities)
            if trial_objective <= objective - _ARMIJO * step * slope:
                break
            step *= 0.5
        else:
            break
        beta, objective, log_probabilities = trial, trial_objective, trial_log_probabilities
    return beta, log_probabilities


def gated_log_densities(
    Z: FloatArray,
    y: FloatArray,
    W: FloatArray,
    theta: FloatArray,
    variances: FloatArray,
    beta: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Log of ``pi_j(z_i) N(y_i; <z_i, theta_j>, sigma_j^2)`` and each row's log-likelihood.

    Returns
    -------
    log_joint : ndarray of shape (n_samples, n_components)
    row_log_likelihood : ndarray of shape (n_samples,)
    """
    residuals = y[:, None] - Z @ theta.T
    return _log_joint(log_gate(W, beta), residuals * residuals, variances)


def _log_joint(
    log_gate_probabilities: FloatArray, squared: FloatArray, variances: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """:func:`gated_log_densities` from the log gate and the squared residuals (n, k)."""
    log_joint = (
        log_gate_probabilities - 0.5 * np.log(2.0 * np.pi * variances) - squared / (2.0 * variances)
    )
    top = log_joint.max(axis=1)
    row_log_likelihood = top + np.log(np.exp(log_joint - top[:, None]).sum(axis=1))
    return log_joint, row_log_likelihood


@dataclass
class GatedEMResult:
    """Lines, noise variances and gate (standardized units) of a gated EM fit, with its trace."""

    theta: FloatArray
    variances: FloatArray
    beta: FloatArray
    log_likelihood_history: list[float]
    """Mean log-likelihood per row (scaled units) before each M-step and at the end."""
    n_iter: int
    converged: bool


def gated_em(
    Z: FloatArray,
    y: FloatArray,
    W: FloatArray,
    theta: FloatArray,
    *,
    max_iter: int,
    tol: float,
    variance_floor: float,
    deadline: float | None = None,
) -> GatedEMResult:
    """EM for the gated mixture of regressions, started from the given lines.

    The start's noise variances and mixing weights come from the lines' hard partition (the
    gate starts as those constant weights); EM then runs until the mean log-likelihood per row
    changes by at most ``tol``, for at most ``max_iter`` iterations or until ``deadline`` (at
    least one iteration runs).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
        The lines' design (scaled features, then the constant column with an intercept).
    y : ndarray of shape (n_samples,)
    W : ndarray of shape (n_samples, p)
        The gate's design (:meth:`GateScaling.design`).
    theta : ndarray of shape (n_components, n_params)
    variance_floor : float
        Smallest noise variance of a line (keeps the likelihood bounded).

    Returns
    -------
    GatedEMResult
    """
    theta = np.array(theta, dtype=np.float64)
    weights, variances = initial_parameters(Z, y, theta, variance_floor)
    beta = np.zeros((theta.shape[0], W.shape[1]))
    beta[:, -1] = np.log(weights) - np.log(weights[0])
    history: list[float] = []
    n_iter, converged = 0, False
    solver = WeightedLeastSquares(Z, y)
    # Each M-step hands the next E-step the squared residuals and log gate it computed.
    residuals = y[:, None] - Z @ theta.T
    squared = residuals * residuals
    log_gate_probabilities = log_gate(W, beta)
    while True:
        log_joint, row_log_likelihood = _log_joint(log_gate_probabilities, squared, variances)
        history.append(float(row_log_likelihood.mean()))
        if len(history) > 1 and abs(history[-1] - history[-2]) <= tol:
            converged = True
            break
        # One iteration runs even past the deadline, so the gate is fitted at least once.
        out_of_time = n_iter > 0 and deadline is not None and time.monotonic() > deadline
        if n_iter == max_iter or out_of_time:
            break
        responsibilities = np.exp(log_joint - row_log_likelihood[:, None])
        mass = responsibilities.sum(axis=0)
        fitted = solver.solve(np.ascontiguousarray(responsibilities.T))
        theta = np.where((mass > _EMPTY_MASS)[:, None], fitted, theta)
        residuals = y[:, None] - Z @ theta.T
        squared = residuals * residuals
        variances = np.maximum(
            np.einsum("ij,ij->j", responsibilities, squared)
            / np.maximum(mass, np.finfo(np.float64).tiny),
            variance_floor,
        )
        if beta.shape[0] > 1:
            beta, log_gate_probabilities = _newton(
                W, responsibilities, beta, log_gate_probabilities, _NEWTON_STEPS
            )
        n_iter += 1
    return GatedEMResult(
        theta=theta,
        variances=variances,
        beta=beta,
        log_likelihood_history=history,
        n_iter=n_iter,
        converged=converged,
    )
