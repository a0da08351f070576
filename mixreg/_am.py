"""Alternating minimization: the paper's gradient AM (Algorithm 1) and classical AM."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ._loss import assign, labels_of
from ._lstsq import lstsq_by_labels, normal_equations_by_label, pseudo_inverse

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


def whitening_preconditioner(Z: FloatArray) -> FloatArray:
    """``(Z^T Z)^+``: the inverse covariance of the rows (pseudo-inverse where singular).

    A gradient multiplied by it is the gradient in whitened coordinates, where every
    direction of the features has the same scale: what makes ``step_size="auto"`` converge in
    a few dozen steps whatever the units of the features.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)

    Returns
    -------
    ndarray of shape (n_params, n_params)
    """
    gram, _, _ = normal_equations_by_label(
        Z, np.zeros(Z.shape[0]), np.zeros((1, Z.shape[0]), dtype=np.intp), 1
    )
    return pseudo_inverse(gram[0, 0])


def _subspace_step(
    direction: FloatArray,
    change: FloatArray,
    gradient: FloatArray,
    previous: tuple[FloatArray, FloatArray] | None,
    labels: NDArray[np.intp],
    residual: FloatArray,
    n_components: int,
) -> tuple[FloatArray, FloatArray]:
    """Each line's exact minimizer, on its rows, within span{direction, previous step}.

    ``change`` (and ``previous[1]``) are the changes of every line's predictions on all rows
    that the direction (the previous step) makes; ``residual`` is each row's residual on its
    own line. Without a previous step (or when it is parallel to the direction) this is the
    exact line search along ``direction``. Returns the step of every line and the change of
    its predictions on all rows.

    Parameters
    ----------
    direction, gradient : ndarray of shape (n_components, n_params)
    change : ndarray of shape (n_components, n_samples)
    previous : (step, change of the step) or None
    labels, residual : ndarray of shape (n_samples,)
    """
    rows = np.arange(labels.size)
    own = change[labels, rows]
    uu = np.bincount(labels, weights=own * own, minlength=n_components)
    # sum_{i in S_j} r_i <z_i, d_j> = <gradient_j, d_j>
    ur = np.einsum("kp,kp->k", gradient, direction)
    line_search = np.where(uu > 0, ur / np.where(uu > 0, uu, 1.0), 0.0)
    if previous is None:
        return line_search[:, None] * direction, line_search[:, None] * change
    previous_own = previous[1][labels, rows]
    uv = np.bincount(labels, weights=own * previous_own, minlength=n_components)
    vv = np.bincount(labels, weights=previous_own * previous_own, minlength=n_components)
    vr = np.bincount(labels, weights=previous_own * residual, minlength=n_components)
    determinant = uu * vv - uv * uv
    # Nearly parallel directions (or an empty line) fall back to the line search.
    plane = determinant > 1e-12 * uu * vv
    safe = np.where(plane, determinant, 1.0)
    along = np.where(plane, (vv * ur - uv * vr) / safe, line_search)
    again = np.where(plane, (uu * vr - uv * ur) / safe, 0.0)
    step = along[:, None] * direction + again[:, None] * previous[0]
    step_change = along[:, None] * change + again[:, None] * previous[1]
    return step, step_change


# Residuals are updated in place after each step (one product fewer per iteration) and
# recomputed from scratch this often, so rounding cannot accumulate.
_RESIDUAL_REFRESH = 25


def gradient_am(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    step_size: float | str,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
) -> SolverResult:
    """Algorithm 1: partition rows by their best line, then one gradient step per line.

    With a number, ``theta_j <- theta_j - (step_size / n) * sum_{i in S_j} grad F_i(theta_j)``
    with ``F_i(theta) = (y_i - <z_i, theta>)^2``: the paper's gamma, exactly.

    With ``"auto"``, each line moves within the span of its gradient in whitened coordinates,
    ``d_j = (Z^T Z)^+ sum_{i in S_j} z_i r_ij``, and its previous step, to the point that
    minimizes its own objective ``sum_{i in S_j} F_i`` on its current rows (the first step is
    an exact line search along ``d_j``; on a fixed partition this is conjugate gradients). The
    step never increases a line's objective and reassigning rows never increases the
    min-loss, so the min-loss never increases; the whitening makes the step insensitive to the
    units and correlations of the features, so about the paper's T = 50 steps suffice.

    A line that wins no rows has a zero gradient and stays where it is.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
        Design matrix, scaled so that row norms are at most about 1.
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
        Initial lines (not modified).
    step_size : float or "auto"
        The paper's gamma, or ``"auto"``.
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
    weights = np.empty((n_components, n_samples))
    preconditioner = whitening_preconditioner(Z) if step_size == "auto" else None
    fixed_scale = None if preconditioner is not None else 2.0 * float(step_size) / n_samples
    residuals = np.empty((n_components, n_samples))
    labels, best = rows, np.empty(0)
    steps_since_refresh = _RESIDUAL_REFRESH

    def evaluate() -> Evaluation:
        nonlocal residuals, labels, best, steps_since_refresh
        if steps_since_refresh >= _RESIDUAL_REFRESH:
            residuals, labels = assign(Z, y, theta)
            steps_since_refresh = 0
        else:
            labels = labels_of(residuals)
        best = residuals[labels, rows]
        loss = float(best @ best) / n_samples
        return Evaluation(loss=loss, criterion=loss)

    previous: tuple[FloatArray, FloatArray] | None = None

    def update() -> None:
        nonlocal steps_since_refresh, previous
        # -grad F_i(theta_j) / 2 = z_i r_ij, summed over the rows S_j that line j wins.
        weights.fill(0.0)
        weights[labels, rows] = best
        gradient = weights @ Z
        if preconditioner is None:
            direction, scale = gradient, np.full(n_components, fixed_scale)
        else:
            direction = gradient @ preconditioner
        # The change of every line's predictions, on all rows: it updates the residuals.
        change = direction @ Z.T
        if preconditioner is None:
            step, step_change = scale[:, None] * direction, scale[:, None] * change
        else:
            step, step_change = _subspace_step(
                direction, change, gradient, previous, labels, best, n_components
            )
            previous = (step, step_change)
        theta[...] += step
        residuals[...] -= step_change
        steps_since_refresh += 1

    result = run_iterations(
        evaluate, update, max_iter=max_iter, tol=tol, deadline=deadline, callback=callback
    )
    result.theta = theta
    return result


@dataclass
class BatchResult:
    """Lines of many starts, each run to its own stopping point, with their traces."""

    thetas: FloatArray
    """Shape (n_starts, n_components, n_params)."""
    loss_histories: list[list[float]]
    """Per start, the min-loss of its lines after every iteration (the start's loss first)."""
    n_iter: NDArray[np.intp]
    converged: NDArray[np.bool_]

    @property
    def losses(self) -> FloatArray:
        return np.array([history[-1] for history in self.loss_histories])

    @property
    def initial_losses(self) -> FloatArray:
        return np.array([history[0] for history in self.loss_histories])


# Residuals held at once while polishing a group of starts: 2^22 float64 values, 32 MiB.
_BATCH_RESIDUAL_ELEMENTS = 1 << 22


def assign_many(
    Z: FloatArray, y: FloatArray, thetas: FloatArray
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Each row's smallest squared residual and best line, for many line sets at once.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    thetas : ndarray of shape (n_sets, n_components, n_params)

    Returns
    -------
    best_squared : ndarray of shape (n_sets, n_samples)
    labels : ndarray of shape (n_sets, n_samples)
        Ties go to the lowest index, as in :func:`assign`.
    """
    n_sets, n_components, n_params = thetas.shape
    if n_sets == 1:
        residuals, labels = assign(Z, y, thetas[0])
        best = residuals[labels, np.arange(Z.shape[0])]
        return (best * best)[None, :], labels[None, :]
    squared = (thetas.reshape(n_sets * n_components, n_params) @ Z.T).reshape(
        n_sets, n_components, Z.shape[0]
    )
    np.subtract(y, squared, out=squared)
    np.square(squared, out=squared)
    labels = np.zeros((n_sets, Z.shape[0]), dtype=np.intp)
    best = squared[:, 0].copy()
    # A loop over the k lines beats argmin along the short middle axis several times over.
    for component in range(1, n_components):
        closer = squared[:, component] < best
        labels[closer] = component
        np.minimum(best, squared[:, component], out=best)
    return best, labels


def classic_am_batch(
    Z: FloatArray,
    y: FloatArray,
    thetas: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
) -> BatchResult:
    """Classical AM from many starts at once: assign rows, refit every line by least squares.

    Every iteration of a group of starts is one matrix product to assign the rows and one to
    accumulate all the parts' normal equations. A start stops when its partition no longer
    changes (a fixed point: refitting would give the same lines) or its min-loss improved by
    a relative ``tol`` or less; its min-loss never increases. A line that wins no rows keeps
    its previous value.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    thetas : ndarray of shape (n_starts, n_components, n_params)
        Starting lines (not modified).
    max_iter : int
        Refits per start at most.
    tol : float
    deadline : float, optional
        ``time.monotonic()`` value after which every start keeps its current lines.
    callback : callable, optional
        Called after every iteration with (iteration, smallest min-loss of all starts so far).

    Returns
    -------
    BatchResult
    """
    thetas = np.array(thetas, dtype=np.float64)
    n_starts, n_components, _ = thetas.shape
    n_samples = Z.shape[0]
    histories: list[list[float]] = [[] for _ in range(n_starts)]
    n_iter = np.zeros(n_starts, dtype=np.intp)
    converged = np.zeros(n_starts, dtype=bool)
    group_size = max(1, _BATCH_RESIDUAL_ELEMENTS // (n_components * n_samples))
    best_so_far = np.inf
    for first in range(0, n_starts, group_size):
        group = np.arange(first, min(first + group_size, n_starts))
        active = group
        fitted_on: NDArray[np.intp] | None = None
        for iteration in range(max_iter + 1):
            squared, labels = assign_many(Z, y, thetas[active])
            losses = squared.mean(axis=1)
            settled = np.zeros(active.size, dtype=bool)
            if iteration > 0:
                previous = np.array([histories[start][-1] for start in active])
                change = np.abs(previous - losses) / np.maximum(
                    np.abs(previous), np.finfo(np.float64).tiny
                )
                settled = change <= tol
                if fitted_on is not None:
                    settled |= (labels == fitted_on).all(axis=1)
            for start, loss in zip(active, losses.tolist(), strict=True):
                histories[start].append(loss)
            best_so_far = min(best_so_far, float(losses.min()))
            if iteration > 0 and callback is not None:
                callback(iteration, best_so_far)
            converged[active[settled]] = True
            keep = ~settled
            active, labels = active[keep], labels[keep]
            out_of_time = deadline is not None and time.monotonic() > deadline
            if active.size == 0 or iteration == max_iter or out_of_time:
                break
            fitted, counts = lstsq_by_labels(Z, y, labels, n_components)
            thetas[active] = np.where((counts > 0)[:, :, None], fitted, thetas[active])
            fitted_on = labels
            n_iter[active] += 1
    return BatchResult(thetas=thetas, loss_histories=histories, n_iter=n_iter, converged=converged)


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
    batch = classic_am_batch(
        Z, y, theta[None], max_iter=max_iter, tol=tol, deadline=deadline, callback=callback
    )
    return SolverResult(
        theta=batch.thetas[0],
        loss_history=batch.loss_histories[0],
        n_iter=int(batch.n_iter[0]),
        converged=bool(batch.converged[0]),
    )
