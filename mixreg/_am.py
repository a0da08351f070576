"""Alternating minimization: the paper's gradient AM (Algorithm 1) and classical AM."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ._loss import assign
from ._lstsq import lstsq_by_label

FloatArray = NDArray[np.float64]
StepCallback = Callable[[int, float], None]
"""Called after every iteration with (iteration, current min-loss); may raise to stop."""


@dataclass
class SolverResult:
    """Lines found by a solver and the trace of its objective."""

    theta: FloatArray
    loss_history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    n_candidates: int = 0

    @property
    def loss(self) -> float:
        return self.loss_history[-1]


def _relative_change(previous: float, current: float) -> float:
    return abs(previous - current) / max(abs(previous), np.finfo(np.float64).tiny)


def gradient_am(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    step_size: float,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
) -> SolverResult:
    """Algorithm 1: partition rows by their best line, then one gradient step per line.

    ``theta_j <- theta_j - (step_size / n) * sum_{i in S_j} grad F_i(theta_j)`` with
    ``F_i(theta) = (y_i - <z_i, theta>)^2``. A line that wins no rows has a zero gradient and
    stays where it is.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
        Design matrix, scaled so that row norms are at most about 1.
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
        Initial lines (not modified).
    step_size : float
        The paper's gamma.
    max_iter : int
        The paper's T.
    tol : float
        Stop when the relative change of the min-loss between iterations is at most ``tol``.
    deadline : float, optional
        ``time.monotonic()`` value after which the current lines are returned.
    callback : callable, optional

    Returns
    -------
    SolverResult
        ``loss_history[t]`` is the min-loss of the lines after ``t`` steps.
    """
    theta = theta.copy()
    n_samples, n_components = Z.shape[0], theta.shape[0]
    rows = np.arange(n_samples)
    result = SolverResult(theta=theta)
    scale = 2.0 * step_size / n_samples
    weights = np.empty((n_components, n_samples))
    for iteration in range(max_iter + 1):
        residuals, labels = assign(Z, y, theta)
        best = residuals[labels, rows]
        loss = float(best @ best) / n_samples
        result.loss_history.append(loss)
        if iteration > 0:
            if callback is not None:
                callback(iteration, loss)
            if _relative_change(result.loss_history[-2], loss) <= tol:
                result.converged = True
                break
        if iteration == max_iter or (deadline is not None and time.monotonic() > deadline):
            break
        # grad F_i(theta_j) = -2 z_i r_ij, summed over the rows S_j that line j wins.
        weights.fill(0.0)
        weights[labels, rows] = best
        theta += scale * (weights @ Z)
        result.n_iter = iteration + 1
    return result


def classic_am(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
) -> SolverResult:
    """Classical AM: partition rows by their best line, then refit each line by least squares.

    A line that wins no rows keeps its previous value. Converges when the partition stops
    changing or the relative min-loss change is at most ``tol``.

    Parameters and return value as :func:`gradient_am` (without ``step_size``).
    """
    theta = theta.copy()
    n_samples, n_components = Z.shape[0], theta.shape[0]
    rows = np.arange(n_samples)
    result = SolverResult(theta=theta)
    previous_labels: NDArray[np.intp] | None = None
    for iteration in range(max_iter + 1):
        residuals, labels = assign(Z, y, theta)
        best = residuals[labels, rows]
        loss = float(best @ best) / n_samples
        result.loss_history.append(loss)
        if iteration > 0:
            if callback is not None:
                callback(iteration, loss)
            unchanged = previous_labels is not None and np.array_equal(labels, previous_labels)
            if unchanged or _relative_change(result.loss_history[-2], loss) <= tol:
                result.converged = True
                break
        if iteration == max_iter or (deadline is not None and time.monotonic() > deadline):
            break
        fitted, counts = lstsq_by_label(Z, y, labels, n_components)
        theta[counts > 0] = fitted[counts > 0]
        previous_labels = labels
        result.n_iter = iteration + 1
    return result
