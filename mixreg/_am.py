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


@dataclass(frozen=True)
class Evaluation:
    """What an iterative algorithm reports about its current lines."""

    loss: float
    """Min-loss of the current lines."""
    criterion: float
    """The quantity whose relative change decides convergence."""
    settled: bool = False
    """Whether another update can no longer change anything."""


def run_iterations(
    evaluate: Callable[[], Evaluation],
    update: Callable[[], None],
    *,
    max_iter: int,
    tol: float,
    deadline: float | None,
    callback: StepCallback | None,
) -> SolverResult:
    """The loop shared by the iterative algorithms: evaluate, stop or update, repeat.

    Stops when the criterion's relative change is at most ``tol``, when the evaluation says it
    has settled, after ``max_iter`` updates, or once ``deadline`` has passed. The returned
    result's ``theta`` is left for the caller to fill in.
    """
    result = SolverResult(theta=np.empty((0, 0)))
    previous = np.nan
    for iteration in range(max_iter + 1):
        current = evaluate()
        result.loss_history.append(current.loss)
        if iteration > 0:
            if callback is not None:
                callback(iteration, current.loss)
            if current.settled or _relative_change(previous, current.criterion) <= tol:
                result.converged = True
                break
        if iteration == max_iter or (deadline is not None and time.monotonic() > deadline):
            break
        previous = current.criterion
        update()
        result.n_iter = iteration + 1
    return result


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
    scale = 2.0 * step_size / n_samples
    weights = np.empty((n_components, n_samples))
    labels, best = rows, np.empty(0)

    def evaluate() -> Evaluation:
        nonlocal labels, best
        residuals, labels = assign(Z, y, theta)
        best = residuals[labels, rows]
        loss = float(best @ best) / n_samples
        return Evaluation(loss=loss, criterion=loss)

    def update() -> None:
        # grad F_i(theta_j) = -2 z_i r_ij, summed over the rows S_j that line j wins.
        weights.fill(0.0)
        weights[labels, rows] = best
        theta[...] += scale * (weights @ Z)

    result = run_iterations(
        evaluate, update, max_iter=max_iter, tol=tol, deadline=deadline, callback=callback
    )
    result.theta = theta
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
    n_components = theta.shape[0]
    labels: NDArray[np.intp] | None = None
    fitted_on: NDArray[np.intp] | None = None

    def evaluate() -> Evaluation:
        nonlocal labels
        residuals, labels = assign(Z, y, theta)
        best = residuals[labels, np.arange(Z.shape[0])]
        loss = float(best @ best) / Z.shape[0]
        settled = fitted_on is not None and np.array_equal(labels, fitted_on)
        return Evaluation(loss=loss, criterion=loss, settled=settled)

    def update() -> None:
        nonlocal fitted_on
        assert labels is not None  # evaluate ran first
        fitted, counts = lstsq_by_label(Z, y, labels, n_components)
        theta[counts > 0] = fitted[counts > 0]
        fitted_on = labels

    result = run_iterations(
        evaluate, update, max_iter=max_iter, tol=tol, deadline=deadline, callback=callback
    )
    result.theta = theta
    return result
