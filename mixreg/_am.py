"""Alternating minimization: the paper's gradient AM (Algorithm 1) and classical AM."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ._loss import Grouping, assign, grouped_assignment, smallest_by_line, weighted_mean
from ._lstsq import WIDE_MIN_PARAMS, WeightedLeastSquares, gram_matrix, lstsq_by_labels
from ._normal_equations import pseudo_inverse
from ._partition_moments import (
    PartitionSums,
    WidePartitionMoments,
    refit_exactly,
    shared_origin,
)

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
    return pseudo_inverse(gram_matrix(Z))


class _GradientSteps:
    """The state of one gradient AM run: residuals kept up to date, row block by row block.

    Residuals of every line on every row are kept and updated in place by each step's change
    of predictions (one tall product fewer per iteration than recomputing them), and
    recomputed from scratch every ``_RESIDUAL_REFRESH`` steps so rounding cannot accumulate.
    Each pass of an iteration walks the rows in blocks whose ``(k, block)`` arrays stay in
    cache, so the work per row (assignment, gradient, line search, update) reads the
    residuals from memory once instead of once per operation.

    A step's update of the residuals is left pending until the next evaluation, which applies
    it block by block just before it assigns that block's rows and adds their gradient: the
    block of ``Z`` and of the residuals is then read from memory once for both, where applying
    the step in a pass of its own read them twice. The numbers are the same, operation for
    operation; :func:`gradient_am` always evaluates after an update.
    """

    def __init__(
        self,
        Z: FloatArray,
        y: FloatArray,
        theta: FloatArray,
        step_size: float | str,
        sample_weight: FloatArray | None = None,
    ) -> None:
        n_samples, n_components = Z.shape[0], theta.shape[0]
        self.Z, self.y, self.theta = Z, y, theta
        self.n_samples, self.n_components = n_samples, n_components
        # With weights, every sum over rows is weighted and "n" is the total weight.
        self.total_weight = float(n_samples if sample_weight is None else sample_weight.sum())
        self.preconditioner = None
        if step_size == "auto":
            whitened = Z if sample_weight is None else Z * np.sqrt(sample_weight)[:, None]
            self.preconditioner = whitening_preconditioner(whitened)
        self.fixed_scale = 0.0
        if self.preconditioner is None:
            self.fixed_scale = 2.0 * float(step_size) / self.total_weight
        rows = max(1, _BLOCK_ELEMENTS // n_components)
        self.blocks = [
            slice(start, min(start + rows, n_samples)) for start in range(0, n_samples, rows)
        ]
        self.block_weights: list[FloatArray] | None = None
        if sample_weight is not None:
            self.block_weights = [sample_weight[block] for block in self.blocks]
        self.residuals = [np.empty((n_components, b.stop - b.start)) for b in self.blocks]
        # Which line owns each row of a block: one-hot over the lines, (k, block).
        self.owners = [np.zeros((n_components, b.stop - b.start), dtype=bool) for b in self.blocks]
        self.parts = np.arange(n_components)[:, None]
        self.gradient = np.zeros_like(theta)
        self.steps_since_refresh = _RESIDUAL_REFRESH
        # "auto": this step's and the previous step's change of every line's predictions.
        self.change: list[FloatArray] = []
        self.previous_change: list[FloatArray] = []
        if self.preconditioner is not None:
            self.change = [np.empty_like(block) for block in self.residuals]
            self.previous_change = [np.empty_like(block) for block in self.residuals]
        self.previous_step: FloatArray | None = None
        # The last step, not yet applied to the residuals: the fixed step's change of the lines
        # or, with "auto", the coefficients of the direction and of the previous step.
        self.pending_step: FloatArray | None = None
        self.pending_coefficients: tuple[FloatArray, FloatArray | None] | None = None

    def evaluate(self) -> Evaluation:
        """Assign the rows, and sum the min-loss and each line's gradient over its rows."""
        refresh = self.steps_since_refresh >= _RESIDUAL_REFRESH
        if refresh:
            self.steps_since_refresh = 0
        total = 0.0
        self.gradient.fill(0.0)
        for index, (block, residuals, owners) in enumerate(
            zip(self.blocks, self.residuals, self.owners, strict=True)
        ):
            Zb = self.Z[block]
            self._apply_pending(index, Zb)
            if refresh:
                np.matmul(self.theta, Zb.T, out=residuals)
                np.subtract(self.y[block], residuals, out=residuals)
            mask = self._assign(residuals, owners)
            # -grad F_i(theta_j) / 2 = z_i r_ij, summed over the rows S_j that line j wins.
            owned = residuals * mask
            best = owned.sum(axis=0)
            if self.block_weights is None:
                total += float(best @ best)
                self.gradient += owned @ Zb
            else:
                weights = self.block_weights[index]
                total += float((best * weights) @ best)
                self.gradient += (owned * weights) @ Zb
        self.pending_step = self.pending_coefficients = None
        loss = total / self.total_weight
        return Evaluation(loss=loss, criterion=loss)

    def _apply_pending(self, index: int, Zb: FloatArray) -> None:
        """Bring block ``index``'s residuals (and with "auto" its changes of predictions) up
        to date with the last step."""
        residuals = self.residuals[index]
        if self.pending_step is not None:
            residuals -= self.pending_step @ Zb.T
        elif self.pending_coefficients is not None:
            along, again = self.pending_coefficients
            change, previous_change = self.change[index], self.previous_change[index]
            # The step's change of predictions, kept for the next step.
            change *= along[:, None]
            if again is not None:
                previous_change *= again[:, None]
                previous_change += change
            else:
                previous_change[...] = change
            residuals -= previous_change

    def _assign(self, residuals: FloatArray, owners: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Each row's best line (ties to the lowest index), written into ``owners`` as a
        one-hot mask over the lines.

        The lines whose squared residual equals the row's smallest are marked, then every mark
        after a row's first is cleared: a few passes over booleans, where labels set line by
        line under a mask cost a gather and a scatter per line.
        """
        squared = residuals * residuals
        smallest = squared[0].copy()
        for component in range(1, self.n_components):
            np.minimum(smallest, squared[component], out=smallest)
        np.equal(squared, smallest, out=owners)
        taken = owners[0].copy()
        for component in range(1, self.n_components):
            # For booleans, a > b is a and not b: keep the mark only where no line before has one.
            np.greater(owners[component], taken, out=owners[component])
            taken |= owners[component]
        if not taken.all():
            # A NaN residual (the minimum is then NaN and equals nothing): the line-by-line
            # comparisons decide, as they always did.
            owners[...] = _labels_line_by_line(squared) == self.parts
        return owners

    def update(self) -> None:
        if self.preconditioner is None:
            step = self.fixed_scale * self.gradient
            self.theta += step
            self.pending_step = step
        else:
            self._subspace_step(self.gradient @ self.preconditioner)
        self.steps_since_refresh += 1

    def _subspace_step(self, direction: FloatArray) -> None:
        """Move each line to its exact minimizer, on its rows, in span{direction, previous step}.

        Without a previous step (or when it is parallel to the direction) this is the exact
        line search along ``direction``.
        """
        k, previous = self.n_components, self.previous_step
        # Per line, over its rows: <u,u>, <u,v>, <v,v>, <v,r> with u the direction's change
        # of predictions and v the previous step's.
        uu, uv, vv, vr = (np.zeros(k) for _ in range(4))
        for index, (block, residuals, owners, change, previous_change) in enumerate(
            zip(
                self.blocks,
                self.residuals,
                self.owners,
                self.change,
                self.previous_change,
                strict=True,
            )
        ):
            np.matmul(direction, self.Z[block].T, out=change)
            mask: NDArray[np.bool_] | FloatArray = owners
            if self.block_weights is not None:
                mask = mask * self.block_weights[index]
            own = change * mask
            uu += np.einsum("kn,kn->k", own, change)
            if previous is not None:
                uv += np.einsum("kn,kn->k", own, previous_change)
                previous_own = previous_change * mask
                vv += np.einsum("kn,kn->k", previous_own, previous_change)
                vr += np.einsum("kn,kn->k", previous_own, residuals)
        # sum_{i in S_j} r_i <z_i, d_j> = <gradient_j, d_j>
        ur = np.einsum("kp,kp->k", self.gradient, direction)
        along = np.where(uu > 0, ur / np.where(uu > 0, uu, 1.0), 0.0)
        again = np.zeros(k)
        if previous is not None:
            determinant = uu * vv - uv * uv
            # Nearly parallel directions (or an empty line) fall back to the line search.
            plane = determinant > 1e-12 * uu * vv
            safe = np.where(plane, determinant, 1.0)
            along = np.where(plane, (vv * ur - uv * vr) / safe, along)
            again = np.where(plane, (uu * vr - uv * ur) / safe, 0.0)
        step = along[:, None] * direction
        if previous is not None:
            step += again[:, None] * previous
        self.pending_coefficients = (along, again if previous is not None else None)
        self.theta += step
        self.previous_step = step


def _labels_line_by_line(squared: FloatArray) -> NDArray[np.intp]:
    """Each row's line: a later line takes the row where its squared residual is strictly
    below the smallest so far (NaN never is, and once in the running minimum, stays)."""
    smallest = squared[0].copy()
    labels = np.zeros(squared.shape[1], dtype=np.intp)
    for component in range(1, squared.shape[0]):
        labels[squared[component] < smallest] = component
        np.minimum(smallest, squared[component], out=smallest)
    return labels


# Elements of a (k, block) array of one row block: 2^15 float64 values, 256 KiB, in cache.
_BLOCK_ELEMENTS = 1 << 15
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
    sample_weight: FloatArray | None = None,
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
    sample_weight : ndarray of shape (n_samples,), optional
        Positive row weights: every sum over rows (min-loss, gradient, whitening, line
        search) is weighted and ``n`` becomes the total weight, so an integer weight acts as
        that many copies of the row.

    Returns
    -------
    SolverResult
        ``loss_history[t]`` is the min-loss of the lines after ``t`` steps.
    """
    steps = _GradientSteps(Z, y, theta.copy(), step_size, sample_weight)
    result = run_iterations(
        steps.evaluate,
        steps.update,
        max_iter=max_iter,
        tol=tol,
        deadline=deadline,
        callback=callback,
    )
    result.theta = steps.theta
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
    Z: FloatArray,
    y: FloatArray,
    thetas: FloatArray,
    *,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Each row's smallest squared residual and best line, for many line sets at once.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    thetas : ndarray of shape (n_sets, n_components, n_params)
    sample_weight : ndarray of shape (n_samples,), optional
        Only weighs the rows of a group against each other.
    grouping : Grouping, optional
        Rows of a group take the line of smallest weighted sum of squared residuals over
        the group (:func:`~mixreg._loss.grouped_assignment`).

    Returns
    -------
    best_squared : ndarray of shape (n_sets, n_samples)
        Each row's squared residual under its line.
    labels : ndarray of shape (n_sets, n_samples)
        Ties go to the lowest index, as in :func:`assign`.
    """
    n_sets, n_components, n_params = thetas.shape
    if grouping is not None:
        squared = (thetas.reshape(n_sets * n_components, n_params) @ Z.T).reshape(
            n_sets, n_components, Z.shape[0]
        )
        np.subtract(y, squared, out=squared)
        np.square(squared, out=squared)
        return grouped_assignment(squared, sample_weight, grouping)
    if n_sets == 1:
        residuals, labels = assign(Z, y, thetas[0])
        best = residuals[labels, np.arange(Z.shape[0])]
        return (best * best)[None, :], labels[None, :]
    squared = (thetas.reshape(n_sets * n_components, n_params) @ Z.T).reshape(
        n_sets, n_components, Z.shape[0]
    )
    np.subtract(y, squared, out=squared)
    np.square(squared, out=squared)
    return smallest_by_line(squared, axis=1)


def classic_am_batch(
    Z: FloatArray,
    y: FloatArray,
    thetas: FloatArray,
    *,
    max_iter: int,
    tol: float,
    deadline: float | None = None,
    callback: StepCallback | None = None,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
    solver: WeightedLeastSquares | None = None,
) -> BatchResult:
    """Classical AM from many starts at once: assign rows, refit every line by least squares.

    Every iteration of a group of starts is one matrix product to assign the rows and an
    update of all the parts' normal equations by the rows that changed parts (one product over
    all rows when many did, :class:`~mixreg._partition_moments.PartitionSums`; on wide data,
    one start at a time, :class:`~mixreg._partition_moments.WidePartitionMoments`). A start
    stops when its partition no longer changes (a fixed point: refitting would give the same
    lines) or its min-loss improved by a relative ``tol`` or less; its min-loss never
    increases. A line that wins no rows keeps its previous value.

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
    sample_weight : ndarray of shape (n_samples,), optional
        Positive row weights: the min-loss is their weighted mean of squared residuals and
        every refit is weighted least squares, so an integer weight acts as that many copies
        of the row.
    grouping : Grouping, optional
        Assign whole groups (:func:`assign_many`) instead of rows.
    solver : WeightedLeastSquares, optional
        Of ``Z`` and ``y``, when the caller keeps one for many polishes of the same rows;
        formed here for more than one start. With it, every refit is read from running sums
        of the parts (:class:`~mixreg._partition_moments.PartitionSums`); without, each part is
        solved centred.

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
    # The rows' outer products, formed once for every iteration's refit.
    if solver is None and n_starts > 1:
        solver = WeightedLeastSquares(Z, y)
    row_products = None if solver is None else solver.products
    # Wide data: one start at a time (memory k p^2, never starts x p^2), its parts' moments
    # kept up to date as rows move, about an origin shared by every start.
    wide = row_products is None and Z.shape[1] > WIDE_MIN_PARAMS
    origin = shared_origin(Z, y, sample_weight) if wide else None
    if wide:
        group_size = 1
    for first in range(0, n_starts, group_size):
        group = np.arange(first, min(first + group_size, n_starts))
        active = group
        # The partitions the lines were last fitted on, with their parts' running sums.
        fitted_on: NDArray[np.intp] | None = None
        moved: NDArray[np.bool_] | None = None
        sums: PartitionSums | None = None
        moments: WidePartitionMoments | None = None
        for iteration in range(max_iter + 1):
            squared, labels = assign_many(
                Z, y, thetas[active], sample_weight=sample_weight, grouping=grouping
            )
            losses = weighted_mean(squared, sample_weight)
            settled = np.zeros(active.size, dtype=bool)
            if iteration > 0:
                previous = np.array([histories[start][-1] for start in active])
                change = np.abs(previous - losses) / np.maximum(
                    np.abs(previous), np.finfo(np.float64).tiny
                )
                settled = change <= tol
                if fitted_on is not None:
                    moved = labels != fitted_on
                    settled |= ~moved.any(axis=1)
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
            if origin is not None:
                moments = (
                    WidePartitionMoments.of(Z, y, labels[0], n_components, origin, sample_weight)
                    if moments is None or moved is None
                    else moments.moved_to(labels[0], moved[keep][0])
                )
                fitted, counts = moments.solve()[None], moments.counts[None]
            elif row_products is None:
                fitted, counts = lstsq_by_labels(
                    Z, y, labels, n_components, sample_weight=sample_weight
                )
            else:
                sums = (
                    PartitionSums.of(Z, y, row_products, labels, n_components, sample_weight)
                    if sums is None or moved is None
                    else sums.moved_to(labels, keep, moved[keep])
                )
                fitted, counts = sums.solve(), sums.counts
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
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> SolverResult:
    """Classical AM: partition rows by their best line, then refit each line by least squares.

    A line that wins no rows keeps its previous value. Converges when the partition stops
    changing or the relative min-loss change is at most ``tol``.

    Parameters and return value as :func:`gradient_am` (without ``step_size``), with
    ``sample_weight`` and ``grouping`` as in :func:`classic_am_batch`.
    """
    batch = classic_am_batch(
        Z,
        y,
        theta[None],
        max_iter=max_iter,
        tol=tol,
        deadline=deadline,
        callback=callback,
        sample_weight=sample_weight,
        grouping=grouping,
    )
    return SolverResult(
        theta=batch.thetas[0],
        loss_history=batch.loss_histories[0],
        n_iter=int(batch.n_iter[0]),
        converged=bool(batch.converged[0]),
    )


# Exact refits after the search: a few rounds at most (each is one pass over the rows).
_EXACT_REFIT_ROUNDS = 5


def refit_exactly_until_stable(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    deadline: float | None = None,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> FloatArray:
    """Refit each line on the rows it wins to working precision, until the partition is stable.

    Classical AM steps with :func:`~mixreg._partition_moments.refit_exactly`: each line ends as the
    least-squares line of the rows it predicts best (``LinearRegression`` on those rows), and
    the min-loss never increases. A line that wins no rows keeps its value. Stops when the
    partition no longer changes, after a few rounds, or once ``deadline`` has passed (after
    one round).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
    sample_weight, grouping
        As in :func:`classic_am_batch`.

    Returns
    -------
    ndarray of shape (n_components, n_params)
    """

    def assigned(lines: FloatArray) -> tuple[float, NDArray[np.intp]]:
        squared, labels = assign_many(
            Z, y, lines[None], sample_weight=sample_weight, grouping=grouping
        )
        return float(weighted_mean(squared[0], sample_weight)), labels[0]

    loss, labels = assigned(theta)
    for _ in range(_EXACT_REFIT_ROUNDS):
        fitted, counts = refit_exactly(Z, y, labels, theta.shape[0], sample_weight=sample_weight)
        candidate = np.where((counts > 0)[:, None], fitted, theta)
        new_loss, new_labels = assigned(candidate)
        if new_loss > loss * (1.0 + 1e-12):
            break
        theta, loss = candidate, new_loss
        if np.array_equal(new_labels, labels) or (
            deadline is not None and time.monotonic() > deadline
        ):
            break
        labels = new_labels
    return theta
