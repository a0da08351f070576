"""The paper's min-loss and the residual computations shared by every solver."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import ThreadpoolController

FloatArray = NDArray[np.float64]

# Rows per block when scoring many candidate line sets: a block of residuals (1 MiB) stays
# in cache, and memory never grows with n * h.
_SCORE_BLOCK_ELEMENTS = 1 << 17
# Below this many residuals per batch, scoring stays on the calling thread.
_PARALLEL_MIN_ELEMENTS = 1 << 22


@cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run BLAS on one thread for the duration of a fit.

    A fit issues many small or tall-and-skinny products, where OpenBLAS's own threads cost
    more than they bring (ten times more on a loaded machine, e.g. with fits running side by
    side); the one heavy pass, candidate scoring, is parallelized over row blocks instead.
    """
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


@dataclass(frozen=True)
class Grouping:
    """Rows bound together: every row of a group belongs to the same line.

    Sums over a group's rows are one ``np.add.reduceat`` over the rows ordered by group (one
    ``np.bincount`` when a group has no rows), never a loop over groups.
    """

    codes: NDArray[np.intp]
    """Shape (n_samples,): each row's group, in ``range(n_groups)``."""
    n_groups: int
    order: NDArray[np.intp] | None = field(default=None, compare=False, repr=False)
    """The rows ordered by group (stable), or None when they already are."""
    bounds: NDArray[np.intp] | None = field(default=None, compare=False, repr=False)
    """Where each group's rows start in that order; None when a group has no rows."""

    @classmethod
    def of(cls, codes: NDArray[np.intp]) -> Grouping:
        codes = np.asarray(codes, dtype=np.intp)
        n_groups = int(codes.max()) + 1
        sizes = np.bincount(codes, minlength=n_groups)
        if not sizes.all():
            return cls(codes=codes, n_groups=n_groups)
        order = None if np.all(codes[1:] >= codes[:-1]) else np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.intp)
        return cls(codes=codes, n_groups=n_groups, order=order, bounds=bounds)

    def sum(self, values: FloatArray) -> FloatArray:
        """Sums over each group's rows of ``values`` (..., n_samples): shape (..., n_groups)."""
        if self.bounds is not None:
            # Contiguous runs of rows: a few times faster than a bincount over every set.
            ordered = values if self.order is None else values[..., self.order]
            reduced: FloatArray = np.add.reduceat(ordered, self.bounds, axis=-1)
            return reduced
        lead = values.shape[:-1]
        n_sets = int(np.prod(lead, dtype=np.intp))
        flat = (np.arange(n_sets)[:, None] * self.n_groups + self.codes).ravel()
        sums: FloatArray = np.bincount(
            flat, weights=values.reshape(n_sets, -1).ravel(), minlength=n_sets * self.n_groups
        ).astype(np.float64, copy=False)
        return sums.reshape(*lead, self.n_groups)

    def sizes(self) -> NDArray[np.intp]:
        """Rows of each group: shape (n_groups,)."""
        return np.bincount(self.codes, minlength=self.n_groups)

    def subset(self, rows: NDArray[np.intp]) -> Grouping:
        """The grouping of the chosen rows, groups renumbered from 0."""
        _, codes = np.unique(self.codes[rows], return_inverse=True)
        return Grouping.of(codes.astype(np.intp).ravel())


def weighted_mean(values: FloatArray, sample_weight: FloatArray | None) -> FloatArray:
    """Mean over the last axis, weighted by ``sample_weight`` when given."""
    if sample_weight is None:
        # The sum over the count is np.mean's own arithmetic, without its per-call overhead
        # (EM takes such means at every iteration).
        mean: FloatArray = values.sum(axis=-1) / values.shape[-1]
        return mean
    weighted: FloatArray = (values @ sample_weight) / sample_weight.sum()
    return weighted


def grouped_assignment(
    squared: FloatArray, sample_weight: FloatArray | None, grouping: Grouping
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Each group's line and each row's squared residual under it.

    Parameters
    ----------
    squared : ndarray of shape (n_sets, n_components, n_samples)
        Squared residuals of every line of every line set.
    sample_weight : ndarray of shape (n_samples,), optional
    grouping : Grouping

    Returns
    -------
    row_squared : ndarray of shape (n_sets, n_samples)
        Each row's squared residual under its group's line.
    labels : ndarray of shape (n_sets, n_samples)
        Each row's group's line: the one of smallest (weighted) sum of squared residuals over
        the group's rows, ties to the lowest index.
    """
    weighted = squared if sample_weight is None else squared * sample_weight
    _, group_labels = smallest_by_line(grouping.sum(weighted), axis=1)
    labels = group_labels[:, grouping.codes]
    row_squared = np.take_along_axis(squared, labels[:, None, :], axis=1)[:, 0, :]
    return row_squared, labels


def predict_lines(X: FloatArray, coef: FloatArray, intercept: FloatArray) -> FloatArray:
    """Predict with every line: the list decoding.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    coef : ndarray of shape (n_components, n_features)
    intercept : ndarray of shape (n_components,)

    Returns
    -------
    predictions : ndarray of shape (n_samples, n_components)
        ``predictions[i, j] = <X[i], coef[j]> + intercept[j]``.
    """
    predictions: FloatArray = X @ coef.T
    predictions += intercept
    return predictions


def gate_probabilities(Z: FloatArray, coef: FloatArray, intercept: FloatArray) -> FloatArray:
    """A gate's mixing probabilities: ``softmax_j(<z, coef_j> + intercept_j)`` per row.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_concomitant)
    coef : ndarray of shape (n_components, n_concomitant)
    intercept : ndarray of shape (n_components,)

    Returns
    -------
    probabilities : ndarray of shape (n_samples, n_components)
    """
    logits: FloatArray = Z @ coef.T
    logits += intercept
    logits -= logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=1, keepdims=True)
    return logits


def min_loss(
    y: FloatArray, predictions: FloatArray, sample_weight: FloatArray | None = None
) -> float:
    """Min-loss of a list-decoded prediction: mean over rows of the best squared error.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
    predictions : array-like of shape (n_samples, n_components)
    sample_weight : array-like of shape (n_samples,), optional
        Non-negative row weights, not all zero.

    Returns
    -------
    loss : float
        ``(1/n) * sum_i min_j (y_i - predictions[i, j]) ** 2``; with weights,
        ``(1/W) * sum_i w_i min_j (y_i - predictions[i, j]) ** 2``, ``W = sum_i w_i``.
    """
    y_arr = np.asarray(y, dtype=np.float64)
    pred = np.asarray(predictions, dtype=np.float64)
    if pred.ndim != 2 or y_arr.ndim != 1 or pred.shape[0] != y_arr.shape[0]:
        raise ValueError(
            f"predictions must have shape (n_samples, n_components) matching y of length "
            f"{y_arr.shape[0] if y_arr.ndim == 1 else y_arr.shape}; got {pred.shape}"
        )
    if y_arr.shape[0] == 0:
        raise ValueError("min_loss needs at least one row")
    if sample_weight is not None:
        weights = np.asarray(sample_weight, dtype=np.float64)
        if weights.shape != y_arr.shape or not np.all(weights >= 0) or not weights.sum() > 0:
            raise ValueError(
                f"sample_weight must hold {y_arr.shape[0]} non-negative numbers, not all zero"
            )
        return weighted_min_loss(y_arr, pred, weights)
    return float(row_min_losses(y_arr, pred).mean())


def weighted_min_loss(
    y: FloatArray,
    predictions: FloatArray,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> float:
    """The min-loss with row weights and groups.

    ``(1/W) sum_i w_i min_j (y_i - predictions[i, j])^2`` with ``W = sum_i w_i``; with
    groups, ``(1/W) sum_g min_j sum_{i in g} w_i (y_i - predictions[i, j])^2``. Without
    either, :func:`min_loss`.
    """
    if grouping is None:
        return float(weighted_mean(row_min_losses(y, predictions), sample_weight))
    residuals = predictions.T - y
    squared, _ = grouped_assignment((residuals * residuals)[None], sample_weight, grouping)
    return float(weighted_mean(squared[0], sample_weight))


def row_min_losses(y: FloatArray, predictions: FloatArray) -> FloatArray:
    """Best squared error of each row, shape (n_samples,)."""
    residuals = predictions - y[:, None]
    best: FloatArray = np.min(residuals * residuals, axis=1)
    return best


def assign(Z: FloatArray, y: FloatArray, thetas: FloatArray) -> tuple[FloatArray, NDArray[np.intp]]:
    """Residuals of every line and the index of each row's best line.

    Ties go to the lowest index, so the partition is deterministic. Residuals are laid out
    line-major, ``(n_components, n_samples)``: ``thetas @ Z.T`` is the fastest orientation of
    this tall-and-skinny product.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    thetas : ndarray of shape (n_components, n_params)

    Returns
    -------
    residuals : ndarray of shape (n_components, n_samples)
        ``y_i - <z_i, theta_j>``.
    labels : ndarray of shape (n_samples,)
    """
    residuals = thetas @ Z.T
    np.subtract(y, residuals, out=residuals)
    return residuals, labels_of(residuals)


def labels_of(residuals: FloatArray) -> NDArray[np.intp]:
    """Index of each row's smallest absolute residual, ties to the lowest index.

    Parameters
    ----------
    residuals : ndarray of shape (n_components, n_samples)

    Returns
    -------
    labels : ndarray of shape (n_samples,)
    """
    return smallest_by_line(np.abs(residuals), axis=0)[1]


def smallest_by_line(values: FloatArray, axis: int) -> tuple[FloatArray, NDArray[np.intp]]:
    """The smallest of ``values`` along the lines' ``axis`` and its index, ties to the lowest.

    A loop over the k lines, each an in-place ``np.minimum`` over all the other axes, beats
    ``np.argmin`` along a short axis several times over.

    Parameters
    ----------
    values : ndarray
        One axis (``axis``) runs over the k lines.
    axis : int

    Returns
    -------
    smallest : ndarray
        ``values`` without ``axis``.
    labels : ndarray of the same shape
    """
    by_line = np.moveaxis(values, axis, 0)
    labels = np.zeros(by_line.shape[1:], dtype=np.intp)
    smallest = by_line[0].copy()
    for component in range(1, by_line.shape[0]):
        closer = by_line[component] < smallest
        labels[closer] = component
        np.minimum(smallest, by_line[component], out=smallest)
    return smallest, labels


def score_candidates(
    Z: FloatArray,
    y: FloatArray,
    candidates: FloatArray,
    sample_weight: FloatArray | None = None,
) -> FloatArray:
    """Min-loss of many candidate line sets on all rows, with one matrix product per row block.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    candidates : ndarray of shape (n_candidates, n_components, n_params)
    sample_weight : ndarray of shape (n_samples,), optional
        Row weights: the min-loss is then their weighted mean of best squared errors.

    Returns
    -------
    losses : ndarray of shape (n_candidates,)
    """
    n_candidates, n_components, n_params = candidates.shape
    n_samples = Z.shape[0]
    # Component-major columns: the k predictions of one candidate are k contiguous blocks of
    # columns, so the minimum over lines is k - 1 in-place np.minimum calls on wide blocks.
    flat = candidates.transpose(1, 0, 2).reshape(n_components * n_candidates, n_params).T
    block = max(1, _SCORE_BLOCK_ELEMENTS // max(1, n_candidates * n_components))
    totals = np.zeros(n_candidates)
    for start in range(0, n_samples, block):
        stop = min(start + block, n_samples)
        squared = Z[start:stop] @ flat
        squared -= y[start:stop, None]
        np.square(squared, out=squared)
        best = squared[:, :n_candidates]
        for component in range(1, n_components):
            columns = slice(component * n_candidates, (component + 1) * n_candidates)
            np.minimum(best, squared[:, columns], out=best)
        row_weights = np.ones(stop - start) if sample_weight is None else sample_weight[start:stop]
        totals += row_weights @ best
    total_weight = n_samples if sample_weight is None else float(sample_weight.sum())
    losses: FloatArray = totals / total_weight
    return losses


# Float32 screening keeps every candidate whose approximate loss is within this relative
# margin (plus a small absolute one, in the scaled space where |y| <= 1) of the smallest;
# those few are rescored exactly in float64, so the chosen candidate is the exact best.
_SCREEN_RELATIVE_MARGIN = 1e-3
_SCREEN_ABSOLUTE_MARGIN = 1e-6
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class CandidateScorer:
    """Finds the best of many candidate line sets on all rows, fast and exactly.

    A float32 pass over ``[Z | y]`` (the ``- y`` folded into the matrix product) screens all
    candidates at twice float64's speed and half its memory traffic; the near-best ones are
    then rescored in float64 by :func:`score_candidates`.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    sample_weight : ndarray of shape (n_samples,), optional
        Row weights of the min-loss.
    """

    def __init__(
        self, Z: FloatArray, y: FloatArray, sample_weight: FloatArray | None = None
    ) -> None:
        self.Z, self.y, self.sample_weight = Z, y, sample_weight
        self._weights32 = None if sample_weight is None else sample_weight.astype(np.float32)
        self._total_weight = float(Z.shape[0] if sample_weight is None else sample_weight.sum())
        n_samples, n_params = Z.shape
        self._Zy = np.empty((n_samples, n_params + 1), dtype=np.float32)
        self._Zy[:, :n_params] = Z
        self._Zy[:, n_params] = y

    def screen(self, candidates: FloatArray) -> NDArray[np.float32]:
        """Approximate (float32) min-loss of each candidate; non-finite ones get +inf."""
        n_candidates, n_components, n_params = candidates.shape
        lines = np.empty((n_params + 1, n_components * n_candidates), dtype=np.float32)
        flat = candidates.transpose(1, 0, 2).reshape(n_components * n_candidates, n_params).T
        lines[:n_params] = np.clip(flat, -_FLOAT32_MAX, _FLOAT32_MAX)
        lines[n_params] = -1.0
        n_samples = self._Zy.shape[0]
        n_threads = min(os.cpu_count() or 1, 8)
        if n_threads == 1 or n_samples * lines.shape[1] < _PARALLEL_MIN_ELEMENTS:
            totals = self._screen_rows(lines, n_candidates, 0, n_samples)
        else:
            bounds = np.linspace(0, n_samples, n_threads + 1).astype(int)
            with ThreadPoolExecutor(n_threads) as pool:
                totals = sum(
                    pool.map(
                        lambda lo_hi: self._screen_rows(lines, n_candidates, *lo_hi),
                        itertools.pairwise(bounds),
                    ),
                    start=np.zeros(n_candidates),
                )
        approx: NDArray[np.float32] = (totals / self._total_weight).astype(np.float32)
        approx[~np.isfinite(approx)] = np.inf
        return approx

    def _screen_rows(
        self, lines: NDArray[np.float32], n_candidates: int, first: int, last: int
    ) -> FloatArray:
        """Sum over rows ``first:last`` of each candidate's smallest squared residual."""
        n_components = lines.shape[1] // n_candidates
        block = max(1, _SCORE_BLOCK_ELEMENTS // lines.shape[1])
        ones = np.ones(block, dtype=np.float32)
        totals = np.zeros(n_candidates)
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(first, last, block):
                stop = min(start + block, last)
                squared = self._Zy[start:stop] @ lines
                np.square(squared, out=squared)
                best = squared[:, :n_candidates]
                for component in range(1, n_components):
                    columns = slice(component * n_candidates, (component + 1) * n_candidates)
                    np.fmin(best, squared[:, columns], out=best)
                row_weights = (
                    ones[: stop - start] if self._weights32 is None else self._weights32[start:stop]
                )
                totals += row_weights @ best
        return totals

    def best(self, candidates: FloatArray) -> tuple[int, float]:
        """Index and exact (float64) min-loss of the best candidate."""
        approx = self.screen(candidates)
        floor = float(approx.min())
        if not np.isfinite(floor):
            near = np.arange(candidates.shape[0])
        else:
            margin = _SCREEN_RELATIVE_MARGIN * floor + _SCREEN_ABSOLUTE_MARGIN
            near = np.flatnonzero(approx <= floor + margin)
        exact = score_candidates(self.Z, self.y, candidates[near], self.sample_weight)
        winner = int(np.argmin(exact))
        return int(near[winner]), float(exact[winner])
