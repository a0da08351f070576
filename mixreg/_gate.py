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

import contextlib
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._em import initial_parameters
from ._loss import weighted_mean
from ._lstsq import WeightedLeastSquares

FloatArray = NDArray[np.float64]

# Newton steps per M-step, warm-started from the previous iteration's gate. One is enough for
# EM to climb (the line search makes it lower the gate's objective) and the gate moves little
# between EM iterations, so one step keeps up with it: EM takes as many iterations as with two
# or more, each of them about half as costly on small data (where per-call overhead, not
# arithmetic, sets the time), and stops at the same maximum to its tolerance.
_NEWTON_STEPS = 1
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
    def of(
        cls, concomitant: FloatArray, sample_weight: FloatArray | None = None
    ) -> tuple[GateScaling, FloatArray]:
        """The scaling of the concomitant matrix (n, q) and its design (n, q + 1); with
        sample weights, their weighted mean and spread (those of the repeated rows)."""
        mean = weighted_mean(concomitant.T, sample_weight)
        centred = concomitant - mean
        spread = np.sqrt(weighted_mean((centred * centred).T, sample_weight))
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
    """Row-wise log-softmax of (..., n, k) logits, without overflow."""
    top = logits.max(axis=-1, keepdims=True)
    shifted: FloatArray = logits - top
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted


def log_gate(W: FloatArray, beta: FloatArray) -> FloatArray:
    """Log mixing probabilities (..., n, k) of design rows ``W`` (n, p) under gates ``beta``
    (..., k, p)."""
    return log_softmax(W @ np.swapaxes(beta, -1, -2))


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
    return float(_objectives(responsibilities, log_probabilities))


def _objectives(responsibilities: FloatArray, log_probabilities: FloatArray) -> FloatArray:
    """:func:`gate_objective` of a stack of gates: arrays (..., n, k) to shape (...)."""
    total: FloatArray = np.einsum("...ij,...ij->...", responsibilities, log_probabilities)
    return -total / int(log_probabilities.shape[-2])


def gate_gradient(W: FloatArray, responsibilities: FloatArray, beta: FloatArray) -> FloatArray:
    """Gradient of :func:`gate_objective` with respect to the free rows ``beta[1:]``.

    Returns
    -------
    gradient : ndarray of shape (n_components - 1, n_gate_params)
        ``(1/n) sum_i (pi_ij - r_ij) w_i`` for every free class j.
    """
    return _gradient(W, responsibilities, np.exp(log_gate(W, beta)))


def _gradient(W: FloatArray, responsibilities: FloatArray, probabilities: FloatArray) -> FloatArray:
    """Gradients of a stack: (..., n, k) probabilities to shape (..., k - 1, p)."""
    excess = np.swapaxes((probabilities - responsibilities)[..., 1:], -1, -2)
    gradient: FloatArray = excess @ W / W.shape[0]
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


_HESSIAN_BLOCK_ELEMENTS = 1 << 20
"""Elements of the per-row products one block of rows of :func:`_hessian` may hold (8 MiB):
the Hessian is summed over row blocks, so a gate of k classes on q columns never holds the
(rows, k, q) products of all rows at once."""


def _hessian(
    W: FloatArray, probabilities: FloatArray, weighted_W: FloatArray | None = None
) -> FloatArray:
    """Hessians of a stack: (..., n, k) probabilities to shape (..., (k - 1) p, (k - 1) p).

    ``weighted_W`` is ``W`` with each row times its weight (mean 1), for a weighted objective.
    Summed over blocks of rows (:data:`_HESSIAN_BLOCK_ELEMENTS`).
    """
    n_samples, p = W.shape
    lead = probabilities.shape[:-2]
    free = probabilities.shape[-1] - 1
    width = free * p
    hessian: FloatArray = np.zeros((*lead, width, width))
    diagonal = np.zeros((*lead, free, p, p))
    block = max(1, _HESSIAN_BLOCK_ELEMENTS // max(1, int(np.prod(lead, dtype=np.int64)) * width))
    for start in range(0, n_samples, block):
        rows = slice(start, min(start + block, n_samples))
        W_rows = W[rows]
        n_rows = W_rows.shape[0]
        block_probabilities = probabilities[..., rows, 1:, None]
        weighted = (block_probabilities * W_rows[:, None, :]).reshape(*lead, n_rows, width)
        if weighted_W is None:
            transposed = np.swapaxes(weighted, -1, -2)
        else:
            transposed = np.swapaxes(
                (block_probabilities * weighted_W[rows][:, None, :]).reshape(*lead, n_rows, width),
                -1,
                -2,
            )
        hessian -= transposed @ weighted
        diagonal += (transposed @ W_rows).reshape(*lead, free, p, p)
    for j in range(free):
        hessian[..., j * p : (j + 1) * p, j * p : (j + 1) * p] += diagonal[..., j, :, :]
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
    fitted, _ = _newton(W, responsibilities[None], beta[None], log_gate(W, beta)[None], max_steps)
    result: FloatArray = fitted[0]
    return result


def _newton(
    W: FloatArray,
    responsibilities: FloatArray,
    beta: FloatArray,
    log_probabilities: FloatArray,
    max_steps: int,
    row_weight: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """:func:`gate_m_step` for a stack of gates at once, from their log-probabilities.

    Each gate takes its own steps, halvings and stop, exactly as alone; the stack shares the
    matrix products and the batched solve. With ``row_weight`` (shape (n_samples,), mean 1)
    the objective, gradient and Hessian weigh each row by it: a row of weight 2 counts as
    two copies of itself.

    Parameters
    ----------
    W : ndarray of shape (n_samples, p)
    responsibilities : ndarray of shape (n_gates, n_samples, n_components)
    beta : ndarray of shape (n_gates, n_components, p)
    log_probabilities : ndarray of shape (n_gates, n_samples, n_components)
        ``log_gate(W, beta)``.

    Returns
    -------
    beta, log_probabilities
        The new gates and their log-probabilities (the next E-step's).
    """
    beta, log_probabilities = beta.copy(), log_probabilities.copy()
    n_gates, n_components, p = beta.shape
    weighted_W, weighted_responsibilities = W, responsibilities
    if row_weight is not None:
        weighted_W = W * row_weight[:, None]
        weighted_responsibilities = responsibilities * row_weight[:, None]
    objective = _objectives(weighted_responsibilities, log_probabilities)
    moving = np.ones(n_gates, dtype=bool)
    for _ in range(max_steps):
        probabilities = np.exp(log_probabilities)
        gradient = _gradient(weighted_W, responsibilities, probabilities).reshape(n_gates, -1)
        moving &= np.max(np.abs(gradient), axis=1) > _GRADIENT_TOL
        if not moving.any():
            break
        hessian = _hessian(W, probabilities, None if row_weight is None else weighted_W)
        diagonal = np.einsum("gii->gi", hessian)
        diagonal += _HESSIAN_DAMPING * np.maximum(
            diagonal.max(axis=1, keepdims=True), np.finfo(np.float64).tiny
        )
        direction = _newton_directions(hessian, gradient)
        slope = np.einsum("gi,gi->g", gradient, direction)
        steps = direction.reshape(n_gates, n_components - 1, p)
        step = np.ones(n_gates)
        searching = moving.copy()
        for _ in range(_HALVINGS):
            trial = beta.copy()
            trial[:, 1:] -= step[:, None, None] * steps
            trial_log_probabilities = log_gate(W, trial)
            trial_objective = _objectives(weighted_responsibilities, trial_log_probabilities)
            accepted = searching & (trial_objective <= objective - _ARMIJO * step * slope)
            if accepted.all():
                # Every gate takes its step (the usual case near the optimum): no gathering.
                beta, log_probabilities, objective = trial, trial_log_probabilities, trial_objective
                searching[:] = False
                break
            beta[accepted] = trial[accepted]
            log_probabilities[accepted] = trial_log_probabilities[accepted]
            objective[accepted] = trial_objective[accepted]
            searching &= ~accepted
            if not searching.any():
                break
            step[searching] *= 0.5
        # A gate whose line search found no step is at its optimum (to rounding): it stops.
        moving &= ~searching
    return beta, log_probabilities


def _newton_directions(hessian: FloatArray, gradient: FloatArray) -> FloatArray:
    """Newton directions of a stack of (damped) systems; the gradient itself where a Hessian
    is singular."""
    directions: FloatArray
    try:
        directions = np.asarray(np.linalg.solve(hessian, gradient[:, :, None])[:, :, 0], np.float64)
        return directions
    except np.linalg.LinAlgError:
        directions = np.array(gradient, dtype=np.float64)
        for gate, (matrix, vector) in enumerate(zip(hessian, gradient, strict=True)):
            with contextlib.suppress(np.linalg.LinAlgError):
                directions[gate] = np.linalg.solve(matrix, vector)
        return directions


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
    """:func:`gated_log_densities` from the log gate and the squared residuals (..., n, k), with
    variances (..., k)."""
    variances = variances[..., None, :]
    log_joint = (
        log_gate_probabilities - 0.5 * np.log(2.0 * np.pi * variances) - squared / (2.0 * variances)
    )
    top = log_joint.max(axis=-1)
    row_log_likelihood = top + np.log(np.exp(log_joint - top[..., None]).sum(axis=-1))
    return log_joint, row_log_likelihood


@dataclass
class GatedEMResult:
    """Lines, noise variances and gate (standardized units) of a gated EM fit, with its trace."""

    theta: FloatArray
    variances: FloatArray
    beta: FloatArray
    log_likelihood_history: list[float]
    """Mean log-likelihood per row (per unit of weight, with sample weights; scaled units)
    before each M-step and at the end."""
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
    sample_weight: FloatArray | None = None,
) -> GatedEMResult:
    """EM for the gated mixture of regressions, started from the given lines.

    The start's noise variances and mixing weights come from the lines' hard partition (the
    gate starts as those constant weights); EM then runs until the mean log-likelihood per row
    changes by at most ``tol``, for at most ``max_iter`` iterations or until ``deadline`` (at
    least one iteration runs).

    With ``sample_weight`` the likelihood is weighted: a row of weight ``w`` counts as ``w``
    copies of itself in every step (the lines' least squares, the variances and the gate's
    Newton steps), and the mean log-likelihood is per unit of weight.

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
    sample_weight : ndarray of shape (n_samples,), optional
        Positive row weights.

    Returns
    -------
    GatedEMResult
    """
    return gated_em_batch(
        Z,
        y,
        W,
        np.asarray(theta, dtype=np.float64)[None],
        max_iter=max_iter,
        tol=tol,
        variance_floor=variance_floor,
        deadline=deadline,
        sample_weight=sample_weight,
    )[0]


# A start still climbing stops when a converged start leads it by more than this many times what
# its last step, repeated for every iteration left, would add: EM's steps shrink, so it cannot
# catch up (its steps would have to grow this much, on average, for the rest of the run).
_CATCH_UP_FACTOR = 10.0


def _outpaced(
    histories: list[list[float]],
    active: NDArray[np.intp],
    converged: NDArray[np.bool_],
    iterations_left: int,
) -> NDArray[np.bool_]:
    """Which of the ``active`` starts (not converged) cannot reach the best converged start's
    likelihood in the iterations left (see :data:`_CATCH_UP_FACTOR`)."""
    outpaced = np.zeros(active.size, dtype=bool)
    if not converged.any():
        return outpaced
    best = max(histories[start][-1] for start in np.flatnonzero(converged).tolist())
    for position, start in enumerate(active.tolist()):
        history = histories[start]
        if converged[start] or len(history) < 2:
            continue
        step = max(history[-1] - history[-2], 0.0)
        outpaced[position] = best - history[-1] > _CATCH_UP_FACTOR * iterations_left * step
    return outpaced


def gated_em_batch(
    Z: FloatArray,
    y: FloatArray,
    W: FloatArray,
    thetas: FloatArray,
    *,
    max_iter: int,
    tol: float,
    variance_floor: float,
    deadline: float | None = None,
    sample_weight: FloatArray | None = None,
) -> list[GatedEMResult]:
    """:func:`gated_em` from many starts at once, each run to its own stop.

    Every iteration of the starts still running is one E-step and one M-step over stacked
    arrays (the per-iteration overhead of small data is paid once); a start leaves the batch
    when its mean log-likelihood per row changes by at most ``tol``, or, reported as not
    converged, when a converged start leads it by more than :data:`_CATCH_UP_FACTOR` times
    what its last step, repeated for every iteration left, would add (a start that cannot
    catch up need not run to ``max_iter``).

    Parameters
    ----------
    thetas : ndarray of shape (n_starts, n_components, n_params)
    Other parameters as :func:`gated_em`.

    Returns
    -------
    list of GatedEMResult
        One per start, in order.
    """
    thetas = np.array(thetas, dtype=np.float64)
    n_starts, n_components, _ = thetas.shape
    weights, variances = initial_parameters(
        Z, y, thetas, variance_floor, sample_weight=sample_weight
    )
    betas = np.zeros((n_starts, n_components, W.shape[1]))
    betas[:, :, -1] = np.log(weights) - np.log(weights[:, :1])
    histories: list[list[float]] = [[] for _ in range(n_starts)]
    n_iter = np.zeros(n_starts, dtype=np.intp)
    converged = np.zeros(n_starts, dtype=bool)
    solver = WeightedLeastSquares(Z, y)
    # The gate's Newton steps weigh the rows by their weights scaled to mean 1.
    row_weight = None
    if sample_weight is not None:
        row_weight = sample_weight * (sample_weight.size / float(sample_weight.sum()))
    active = np.arange(n_starts)
    # Each M-step hands the next E-step the squared residuals and log gate it computed.
    residuals = y[:, None] - Z @ np.swapaxes(thetas, -1, -2)
    squared = residuals * residuals
    log_gate_probabilities = log_gate(W, betas)
    for iteration in range(max_iter + 1):
        log_joint, row_log_likelihood = _log_joint(
            log_gate_probabilities, squared, variances[active]
        )
        means = weighted_mean(row_log_likelihood, sample_weight)
        settled = np.zeros(active.size, dtype=bool)
        for position, start in enumerate(active.tolist()):
            history = histories[start]
            history.append(float(means[position]))
            settled[position] = len(history) > 1 and abs(history[-1] - history[-2]) <= tol
        converged[active[settled]] = True
        keep = ~settled & ~_outpaced(histories, active, converged, max_iter - iteration)
        # One iteration runs even past the deadline, so the gate is fitted at least once.
        out_of_time = iteration > 0 and deadline is not None and time.monotonic() > deadline
        active = active[keep]
        if active.size == 0 or iteration == max_iter or out_of_time:
            break
        log_joint, row_log_likelihood = log_joint[keep], row_log_likelihood[keep]
        log_gate_probabilities = log_gate_probabilities[keep]
        responsibilities = np.exp(log_joint - row_log_likelihood[:, :, None])
        weighted = (
            responsibilities if sample_weight is None else responsibilities * sample_weight[:, None]
        )
        mass = weighted.sum(axis=1)
        fitted = solver.solve(
            np.swapaxes(weighted, -1, -2).reshape(active.size * n_components, -1)
        ).reshape(active.size, n_components, -1)
        thetas[active] = np.where((mass > _EMPTY_MASS)[:, :, None], fitted, thetas[active])
        residuals = y[:, None] - Z @ np.swapaxes(thetas[active], -1, -2)
        squared = residuals * residuals
        variances[active] = np.maximum(
            np.einsum("gij,gij->gj", weighted, squared)
            / np.maximum(mass, np.finfo(np.float64).tiny),
            variance_floor,
        )
        if n_components > 1:
            betas[active], log_gate_probabilities = _newton(
                W,
                responsibilities,
                betas[active],
                log_gate_probabilities,
                _NEWTON_STEPS,
                row_weight,
            )
        n_iter[active] += 1
    return [
        GatedEMResult(
            theta=thetas[start],
            variances=variances[start],
            beta=betas[start],
            log_likelihood_history=histories[start],
            n_iter=int(n_iter[start]),
            converged=bool(converged[start]),
        )
        for start in range(n_starts)
    ]
