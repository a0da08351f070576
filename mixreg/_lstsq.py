"""Least squares for every algorithm: centred, batched, right whatever the data's location.

Every solve follows scikit-learn's ``LinearRegression``: when the design has an intercept
column (a last column of ones), the features and the target are centred on the weighted mean
of the rows of each part before the slopes are solved for, and the intercept is the mean
target minus the mean features times the slopes. Without centring, a feature far from zero
(a year, a timestamp, a price) makes the slope's direction look negligible next to the
intercept's and the slope is lost.

Parts with many rows are accumulated over row blocks as centred moments (weight, mean and
scatter of ``[features, y]``), merged block by block with Chan's pairwise update, so the
centring never needs a second pass over the data; parts with no more rows than parameters
are solved from their rows by an SVD (the minimum-norm answer, as ``LinearRegression``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import dsyrk

from ._normal_equations import _RCOND, solve_normal_equations

FloatArray = NDArray[np.float64]

# Rows per block when accumulating over all samples, at most; blocks are also bounded in bytes.
_GRAM_BLOCK_ROWS = 1 << 16
# Elements of a block of gathered rows (or of the one-hot membership and outer products when
# many small parts share one product): 2^22 float64 values, 32 MiB.
_BLOCK_ELEMENTS = 1 << 22
_MEMBERSHIP_BLOCK_ELEMENTS = 1 << 20
# Elements of the buffer of one block's centred, weighted rows stacked part by part (2 MiB):
# small enough to stay in cache between its writing and the product that reads it.
_WEIGHTED_BLOCK_ELEMENTS = 1 << 18
# Up to this many parameters, the parts of many partitions share one product of their one-hot
# memberships with the rows' outer products; above it, each part's gathered rows make their
# own BLAS product (the shared products grow as p^2 per row and per part).
_SHARED_PRODUCTS_MAX_PARAMS = 16
# Above this many parameters, classical AM keeps one partition's moments up to date as rows
# move (:class:`~mixreg._partition_moments.WidePartitionMoments`) instead of summing every
# part again each iteration: a refit then costs the moved rows' products (``moved x p^2``)
# and ``k`` solves of size p, where summing again costs ``n x p^2``; and the partitions of a
# batch are summed and solved one at a time. At or below it the batched paths are unchanged.
WIDE_MIN_PARAMS = 32


def has_intercept_column(Z: FloatArray) -> bool:
    """Whether the design's last column is all ones (an intercept, so centring is exact)."""
    return bool(Z.shape[1] > 1 and np.all(Z[:, -1] == 1.0))


def _problems_budget(n_params: int) -> int:
    """Elements of a batch of small problems' gathered rows: on wide data an eighth of a
    block (4 MiB), as each is copied a few times while it is solved."""
    return _BLOCK_ELEMENTS if n_params <= WIDE_MIN_PARAMS else _BLOCK_ELEMENTS >> 3


def _block_rows(n_columns: int) -> int:
    # Wide data: blocks of an eighth (4 MiB), as a block is copied a few times (gathered,
    # centred) while the whole sample may be a single block of the default size.
    elements = _BLOCK_ELEMENTS if n_columns <= WIDE_MIN_PARAMS + 1 else _BLOCK_ELEMENTS >> 3
    return int(min(_GRAM_BLOCK_ROWS, max(1, elements // max(n_columns, 1))))


def gram_matrix(Z: FloatArray) -> FloatArray:
    """``Z^T Z`` accumulated over row blocks.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)

    Returns
    -------
    ndarray of shape (n_params, n_params)
    """
    gram = np.zeros((Z.shape[1], Z.shape[1]))
    rows = _block_rows(Z.shape[1])
    for start in range(0, Z.shape[0], rows):
        block = Z[start : start + rows]
        gram += block.T @ block
    return gram


@dataclass
class _Moments:
    """Weight, mean and centred scatter of ``[features, y]`` of many parts.

    Without an intercept the means stay zero and the scatter is the raw sum of products.
    """

    weight: FloatArray
    """Shape (n_parts,)."""
    mean: FloatArray
    """Shape (n_parts, n_columns)."""
    scatter: FloatArray
    """Shape (n_parts, n_columns, n_columns)."""

    @classmethod
    def zeros(cls, n_parts: int, n_columns: int) -> _Moments:
        return cls(
            np.zeros(n_parts),
            np.zeros((n_parts, n_columns)),
            np.zeros((n_parts, n_columns, n_columns)),
        )

    def subset(self, chosen: NDArray[np.bool_]) -> _Moments:
        """The moments of the chosen parts."""
        return _Moments(self.weight[chosen], self.mean[chosen], self.scatter[chosen])

    def add(
        self, part: int, rows: FloatArray, centre: bool, weights: FloatArray | None = None
    ) -> None:
        """Merge the (weighted) rows of one block into part ``part`` (Chan's pairwise update)."""
        weight = float(rows.shape[0] if weights is None else weights.sum())
        if weight <= 0.0:
            return
        if centre:
            mean = (rows.sum(axis=0) if weights is None else weights @ rows) / weight
            centred = rows - mean
            if weights is not None:
                centred *= np.sqrt(weights)[:, None]
        else:
            mean, centred = np.zeros(rows.shape[1]), rows
            if weights is not None:
                centred = centred * np.sqrt(weights)[:, None]
        scatter = cross_products(centred)
        total = self.weight[part] + weight
        if centre and self.weight[part] > 0.0:
            delta = mean - self.mean[part]
            scatter += (self.weight[part] * weight / total) * np.outer(delta, delta)
            self.mean[part] += delta * (weight / total)
        elif centre:
            self.mean[part] = mean
        self.scatter[part] += scatter
        self.weight[part] = total

    def solve(self, centre: bool) -> FloatArray:
        """Least-squares line of every part (zeros for an empty part): (n_parts, n_params)."""
        n_x = self.mean.shape[1] - 1
        slopes = solve_normal_equations(self.scatter[:, :n_x, :n_x], self.scatter[:, :n_x, n_x])
        if not centre:
            return slopes
        intercept = self.mean[:, n_x] - np.einsum("pi,pi->p", self.mean[:, :n_x], slopes)
        theta: FloatArray = np.concatenate([slopes, intercept[:, None]], axis=1)
        theta[self.weight <= 0.0] = 0.0
        return theta


def cross_products(rows: FloatArray) -> FloatArray:
    """``rows^T rows`` by BLAS's symmetric rank-k update (half the work of a general product)."""
    if rows.shape[0] == 0:
        return np.zeros((rows.shape[1], rows.shape[1]))
    # rows.T of a C-ordered array is Fortran-ordered: BLAS reads it without a copy.
    upper = dsyrk(1.0, np.asfortranarray(rows.T), trans=0)
    products: FloatArray = np.triu(upper) + np.triu(upper, 1).T
    return products


def _augmented(Z: FloatArray, y: FloatArray, centre: bool) -> FloatArray:
    """``[features, y]``: the design without its intercept column (when centring), then y."""
    n_x = Z.shape[1] - centre
    augmented = np.empty((Z.shape[0], n_x + 1))
    augmented[:, :n_x] = Z[:, :n_x]
    augmented[:, n_x] = y
    return augmented


def lstsq_of_rows(rows: FloatArray, weights: FloatArray | None, centre: bool) -> FloatArray:
    """Least squares of a stack of small problems from their rows (``LinearRegression``'s answer).

    Each problem is centred on its weighted means (with an intercept), then solved through the
    smaller of its two Gram matrices: ``A^T A`` (parameters x parameters) when it has more rows
    than parameters, else the rows' ``A A^T`` (the minimum-norm slopes ``A^T (A A^T)^+ t``,
    cheap for the many tiny parts of a sub-sample of wide data).

    Parameters
    ----------
    rows : ndarray of shape (n_problems, m, n_columns)
        Each problem's rows as ``[features, y]`` (features without the intercept column when
        ``centre``).
    weights : ndarray of shape (n_problems, m), optional
        Row weights (0 leaves a padding row out); all ones when omitted.
    centre : bool
        Fit an intercept: centre on the weighted means, put the intercept last.

    Returns
    -------
    theta : ndarray of shape (n_problems, n_columns - 1 + centre)
        Zeros for a problem without weight; the minimum-norm slopes where rank-deficient.
    """
    n_problems, m, n_columns = rows.shape
    n_x = n_columns - 1
    if weights is None:
        weights = np.ones((n_problems, m))
    total = weights.sum(axis=1)
    safe_total = np.where(total > 0, total, 1.0)
    mean = np.zeros((n_problems, n_columns))
    if centre:
        mean = np.einsum("pm,pmc->pc", weights, rows) / safe_total[:, None]
    centred = (rows - mean[:, None, :]) * np.sqrt(weights)[:, :, None]
    features, target = centred[:, :, :n_x], centred[:, :, n_x]
    if m > n_x:
        gram = np.matmul(features.transpose(0, 2, 1), features)
        slopes = solve_normal_equations(gram, np.einsum("pmx,pm->px", features, target))
    else:
        kernel = np.matmul(features, features.transpose(0, 2, 1))
        eigvals, eigvecs = np.linalg.eigh(kernel)
        cutoff = _RCOND * np.maximum(eigvals[:, -1:], 0.0)
        keep = eigvals > np.maximum(cutoff, np.finfo(np.float64).tiny)
        inverse = np.where(keep, 1.0 / np.where(keep, eigvals, 1.0), 0.0)
        dual = np.einsum("pmr,pr->pm", eigvecs, np.einsum("pmr,pm->pr", eigvecs, target) * inverse)
        slopes = np.einsum("pmx,pm->px", features, dual)
    if centre:
        intercept = mean[:, n_x] - np.einsum("px,px->p", mean[:, :n_x], slopes)
        slopes = np.concatenate([slopes, intercept[:, None]], axis=1)
    slopes[total <= 0] = 0.0
    theta: FloatArray = slopes
    return theta


def lstsq_of_parts(
    Z: FloatArray,
    y: FloatArray,
    parts: NDArray[np.intp],
    valid: NDArray[np.bool_] | FloatArray,
) -> FloatArray:
    """Least squares of each part's rows, given as padded row indices, in batches.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    parts : ndarray of shape (n_parts, width)
        Row indices of each part; entries where ``valid`` is False are padding.
    valid : ndarray of shape (n_parts, width)
        Which entries are rows, or each entry's weight (0 for padding).

    Returns
    -------
    theta : ndarray of shape (n_parts, n_params)
        Zeros for an empty part.
    """
    centre = has_intercept_column(Z)
    n_parts, width = parts.shape
    n_x = Z.shape[1] - centre
    # A batch's gathered rows and its Gram (or kernel) matrices stay within one block.
    per_problem = width * (n_x + 1) + min(width, n_x) ** 2
    per_batch = max(1, _problems_budget(Z.shape[1]) // max(1, per_problem))
    theta = np.zeros((n_parts, Z.shape[1]))
    for start in range(0, n_parts, per_batch):
        chosen = parts[start : start + per_batch]
        rows = np.empty((chosen.shape[0], width, n_x + 1))
        rows[:, :, :n_x] = Z[chosen, :n_x]
        rows[:, :, n_x] = y[chosen]
        weights = valid[start : start + per_batch].astype(np.float64)
        theta[start : start + per_batch] = lstsq_of_rows(rows, weights, centre)
    return theta


def lstsq_row_sets(Z: FloatArray, y: FloatArray, row_sets: NDArray[np.intp]) -> FloatArray:
    """Least squares of many small sets of rows (repeats count twice), gathered in batches.

    Memory is bounded by a batch of gathered rows, never ``n_samples x n_params^2``.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    row_sets : ndarray of shape (n_problems, m)
        Row indices of each problem.

    Returns
    -------
    theta : ndarray of shape (n_problems, n_params)
    """
    return lstsq_of_parts(Z, y, row_sets, np.ones(row_sets.shape, dtype=bool))


@functools.cache
def _upper_triangle(n_params: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Row and column indices of the upper triangle of a ``n_params`` square (cached: the
    iterative fits ask for the same few sizes thousands of times)."""
    rows, cols = np.triu_indices(n_params)
    return rows, cols


def _row_products(Z: FloatArray, y: FloatArray) -> FloatArray:
    """Each row's ``z z^T`` (upper triangle) followed by ``z y``: shape (n_rows, n_upper + p)."""
    upper_rows, upper_cols = _upper_triangle(Z.shape[1])
    n_upper = upper_rows.size
    products = np.empty((Z.shape[0], n_upper + Z.shape[1]))
    np.multiply(Z[:, upper_rows], Z[:, upper_cols], out=products[:, :n_upper])
    np.multiply(Z, y[:, None], out=products[:, n_upper:])
    return products


def _unpack_sums(sums: FloatArray, n_params: int) -> tuple[FloatArray, FloatArray]:
    """Symmetric Gram matrices and right-hand sides from sums of :func:`_row_products`."""
    upper_rows, upper_cols = _upper_triangle(n_params)
    n_upper = upper_rows.size
    gram = np.empty((sums.shape[0], n_params, n_params))
    gram[:, upper_rows, upper_cols] = sums[:, :n_upper]
    gram[:, upper_cols, upper_rows] = sums[:, :n_upper]
    return gram, sums[:, n_upper:]


def _summed_products(
    Z: FloatArray,
    y: FloatArray,
    n_parts: int,
    weights_of_rows: Callable[[int, int], FloatArray],
    row_products: FloatArray | None = None,
) -> FloatArray:
    """``sum_i w_pi`` times each row's :func:`_row_products`, for many parts ``p`` at once.

    Each block of rows' outer products is formed once and shared by every part in one matrix
    product, or read from ``row_products`` (:func:`_row_products` of all rows) when given.

    Returns
    -------
    ndarray of shape (n_parts, n_params * (n_params + 3) // 2)
    """
    n_samples, n_params = Z.shape
    n_columns = n_params * (n_params + 3) // 2
    sums = np.zeros((n_parts, n_columns))
    block_rows = max(1, _MEMBERSHIP_BLOCK_ELEMENTS // max(n_parts, n_columns))
    for start in range(0, n_samples, block_rows):
        stop = min(start + block_rows, n_samples)
        products = (
            _row_products(Z[start:stop], y[start:stop])
            if row_products is None
            else row_products[start:stop]
        )
        sums += weights_of_rows(start, stop) @ products
    return sums


def _weighted_sums(
    Z: FloatArray,
    y: FloatArray,
    n_parts: int,
    weights_of_rows: Callable[[int, int], FloatArray],
    row_products: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """``sum_i w_pi z_i z_i^T`` and ``sum_i w_pi z_i y_i`` for many parts ``p`` in shared products.

    Only the upper triangle of the outer products is summed (Gram matrices are symmetric;
    the right-hand sides ride along as extra columns; see :func:`_summed_products`). Used for
    few parameters only (the data are standardized by the estimator, so these uncentred sums
    lose nothing that matters for a starting point).

    Returns
    -------
    gram : ndarray of shape (n_parts, n_params, n_params)
    rhs : ndarray of shape (n_parts, n_params)
    """
    sums = _summed_products(Z, y, n_parts, weights_of_rows, row_products)
    return _unpack_sums(sums, Z.shape[1])


def _memberships(
    labels: NDArray[np.intp], n_components: int, sample_weight: FloatArray | None
) -> Callable[[int, int], FloatArray]:
    """The (weighted) one-hot memberships of a block of rows in every part of every partition:
    shape (n_partitions * n_components, block rows)."""
    n_partitions = labels.shape[0]
    parts = np.arange(n_components)[None, :, None]

    def membership(start: int, stop: int) -> FloatArray:
        one_hot = (labels[:, None, start:stop] == parts).reshape(
            n_partitions * n_components, stop - start
        )
        weights: FloatArray = one_hot.astype(np.float64)
        if sample_weight is not None:
            weights *= sample_weight[start:stop]
        return weights

    return membership


class WeightedLeastSquares:
    """Weighted least squares of fixed rows under ever new weights (EM's M-steps).

    An iterative fit solves the same rows' normal equations under new weights at every
    iteration. With few parameters and rows enough to hold them, the rows' outer products
    are formed once here (``products``), and every solve then reads them instead of forming
    them again: the same sums as :func:`lstsq_weighted`, to the last bit.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    """

    def __init__(self, Z: FloatArray, y: FloatArray) -> None:
        self.Z, self.y = Z, y
        n_samples, n_params = Z.shape
        n_columns = n_params * (n_params + 3) // 2
        self.products: FloatArray | None = None
        """The rows' outer products and ``z y`` (see :func:`_weighted_sums`), or None when
        there are too many parameters or rows to keep them (a block of gathered rows)."""
        if n_params <= _SHARED_PRODUCTS_MAX_PARAMS and n_samples * n_columns <= _BLOCK_ELEMENTS:
            self.products = _row_products(Z, y)

    def solve(self, weights: FloatArray) -> FloatArray:
        """The weighted least-squares line of every row of ``weights``.

        Parameters
        ----------
        weights : ndarray of shape (n_parts, n_samples)
            Non-negative sample weights per part.

        Returns
        -------
        theta : ndarray of shape (n_parts, n_params)
        """
        return lstsq_weighted(self.Z, self.y, weights, row_products=self.products)


def _shares_products(n_parts: int, n_params: int) -> bool:
    return n_parts > 1 and n_params <= _SHARED_PRODUCTS_MAX_PARAMS


def normal_equations_by_label(
    Z: FloatArray,
    y: FloatArray,
    labels: NDArray[np.intp],
    n_components: int,
    *,
    sample_weight: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, NDArray[np.intp]]:
    """Uncentred normal equations ``Z_P^T Z_P``, ``Z_P^T y_P`` of every part of many partitions.

    For moves that add the normal equations of parts together (merging two lines' rows); a
    part's own line comes from the centred :func:`lstsq_by_labels`. Each part's rows are
    gathered block by block and multiplied by BLAS: memory of one block, whatever ``p``.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_partitions, n_samples)
    n_components : int
    sample_weight : ndarray of shape (n_samples,), optional
        Row weights of the sums.

    Returns
    -------
    gram : ndarray of shape (n_partitions, n_components, n_params, n_params)
    rhs : ndarray of shape (n_partitions, n_components, n_params)
    counts : ndarray of shape (n_partitions, n_components)
    """
    n_partitions, n_samples = labels.shape
    n_params = Z.shape[1]
    gram = np.zeros((n_partitions, n_components, n_params, n_params))
    rhs = np.zeros((n_partitions, n_components, n_params))
    rows_per_block = _block_rows(n_params)
    for start in range(0, n_samples, rows_per_block):
        Zb, yb = Z[start : start + rows_per_block], y[start : start + rows_per_block]
        for partition in range(n_partitions):
            block_labels = labels[partition, start : start + rows_per_block]
            order = np.argsort(block_labels, kind="stable")
            bounds = np.concatenate(
                [[0], np.cumsum(np.bincount(block_labels, minlength=n_components))]
            )
            gathered_Z, gathered_y = Zb[order], yb[order]
            weighted_Z = gathered_Z
            if sample_weight is not None:
                block_weights = sample_weight[start : start + rows_per_block][order]
                weighted_Z = gathered_Z * block_weights[:, None]
            for component in range(n_components):
                rows = slice(bounds[component], bounds[component + 1])
                gram[partition, component] += weighted_Z[rows].T @ gathered_Z[rows]
                rhs[partition, component] += weighted_Z[rows].T @ gathered_y[rows]
    flat = labels + n_components * np.arange(n_partitions)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n_partitions * n_components)
    return gram, rhs, counts.reshape(n_partitions, n_components)


def lstsq_by_labels(
    Z: FloatArray,
    y: FloatArray,
    labels: NDArray[np.intp],
    n_components: int,
    *,
    sample_weight: FloatArray | None = None,
    row_products: FloatArray | None = None,
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Least squares of each part of many partitions of all rows.

    With few parameters and many parts, one product of the one-hot memberships with the rows'
    outer products serves every part; otherwise each part's rows are gathered block by block
    and accumulated as centred moments, or, when all rows fit in one block and a part has no
    more rows than parameters, solved from its rows by an SVD.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_partitions, n_samples)
    n_components : int
    sample_weight : ndarray of shape (n_samples,), optional
        Positive row weights: weighted least squares, centred on the weighted means.
    row_products : ndarray, optional
        :attr:`WeightedLeastSquares.products` of ``Z`` and ``y``, read instead of formed
        (the shared products of a batched polish).

    Returns
    -------
    theta : ndarray of shape (n_partitions, n_components, n_params)
        A part with no rows gets zeros; callers decide what to keep instead.
    counts : ndarray of shape (n_partitions, n_components)
        Rows of each part.
    """
    n_partitions = labels.shape[0]
    n_params = Z.shape[1]
    n_parts = n_partitions * n_components
    flat = labels + n_components * np.arange(n_partitions)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n_parts).reshape(n_partitions, n_components)
    # One partition (a refit) is always centred part by part; the shared products serve the
    # many starts of a batched polish.
    if n_partitions > 1 and _shares_products(n_parts, n_params):
        membership = _memberships(labels, n_components, sample_weight)
        gram, rhs = _weighted_sums(Z, y, n_parts, membership, row_products)
        theta = solve_normal_equations(gram, rhs)
        return theta.reshape(n_partitions, n_components, n_params), counts
    centre = has_intercept_column(Z)
    theta = np.zeros((n_parts, n_params))
    # Wide data: the partitions are summed and solved one at a time (memory of one
    # partition's k (p + 1)^2 moments, never partitions x p^2); narrow data: all at once.
    per_group = 1 if n_params > WIDE_MIN_PARAMS else n_partitions
    small: list[tuple[int, FloatArray, FloatArray | None]] = []
    small_elements = 0
    for first in range(0, n_partitions, per_group):
        group = range(first, min(first + per_group, n_partitions))
        moments = _Moments.zeros(len(group) * n_components, n_params - centre + 1)
        offset = first * n_components
        small_elements = _sum_parts(
            Z,
            y,
            labels,
            n_components,
            group,
            moments,
            offset,
            small,
            small_elements,
            sample_weight,
        )
        if len(small) and small_elements > _problems_budget(n_params):
            _solve_small(theta, small, n_params, centre)
            small, small_elements = [], 0
        accumulated = moments.weight > 0
        if accumulated.any():
            solved_parts = np.flatnonzero(accumulated) + offset
            theta[solved_parts] = moments.subset(accumulated).solve(centre)
    if small:
        _solve_small(theta, small, n_params, centre)
    return theta.reshape(n_partitions, n_components, n_params), counts


def _sum_parts(
    Z: FloatArray,
    y: FloatArray,
    labels: NDArray[np.intp],
    n_components: int,
    group: range,
    moments: _Moments,
    offset: int,
    small: list[tuple[int, FloatArray, FloatArray | None]],
    small_elements: int,
    sample_weight: FloatArray | None,
) -> int:
    """Accumulate the parts of the partitions ``group`` into ``moments`` (part ``i`` at index
    ``i - offset``), block by block; when all rows are one block, parts with no more rows than
    parameters go to ``small`` instead (copied). Returns the elements held in ``small``."""
    n_samples, n_params = Z.shape
    centre = has_intercept_column(Z)
    rows_per_block = _block_rows(n_params)
    for start in range(0, n_samples, rows_per_block):
        augmented = _augmented(
            Z[start : start + rows_per_block], y[start : start + rows_per_block], centre
        )
        one_block = start == 0 and augmented.shape[0] == n_samples
        for partition in group:
            block_labels = labels[partition, start : start + rows_per_block]
            order = np.argsort(block_labels, kind="stable")
            bounds = np.concatenate(
                [[0], np.cumsum(np.bincount(block_labels, minlength=n_components))]
            )
            gathered_weights = (
                None
                if sample_weight is None
                else sample_weight[start : start + rows_per_block][order]
            )
            for component in range(n_components):
                part_rows = slice(bounds[component], bounds[component + 1])
                # Gathered part by part: a copy of one part's rows, not of the whole block.
                rows = augmented[order[part_rows]]
                weights_of_part = None if gathered_weights is None else gathered_weights[part_rows]
                part = partition * n_components + component
                if one_block and 0 < rows.shape[0] <= n_params:
                    small.append((part, rows, weights_of_part))
                    small_elements += rows.size
                else:
                    moments.add(part - offset, rows, centre, weights_of_part)
    return small_elements


def _solve_small(
    theta: FloatArray,
    small: list[tuple[int, FloatArray, FloatArray | None]],
    n_params: int,
    centre: bool,
) -> None:
    """Solve the parts of ``small`` into their rows of ``theta``."""
    if small:
        # Parts with no more rows than parameters (a sub-sample of wide data), padded to one
        # width and solved together, a batch at a time.
        width = max(rows.shape[0] for _, rows, _ in small)
        per_batch = max(1, _problems_budget(n_params) // (width * (n_params + 1) + width * width))
        solved_batches = []
        for first in range(0, len(small), per_batch):
            batch = small[first : first + per_batch]
            padded = np.zeros((len(batch), width, n_params - centre + 1))
            weights = np.zeros((len(batch), width))
            for position, (_, rows, row_weights) in enumerate(batch):
                padded[position, : rows.shape[0]] = rows
                weights[position, : rows.shape[0]] = 1.0 if row_weights is None else row_weights
            solved_batches.append(lstsq_of_rows(padded, weights, centre))
        solved = np.concatenate(solved_batches)
        theta[[part for part, _, _ in small]] = solved


def lstsq_by_label(
    Z: FloatArray, y: FloatArray, labels: NDArray[np.intp], n_components: int
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Least squares of each part of a partition of all rows, streaming over row blocks.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_samples,)
        The part of each row, in ``range(n_components)``.
    n_components : int

    Returns
    -------
    theta : ndarray of shape (n_components, n_params)
        A part with no rows gets zeros; callers decide what to keep instead.
    counts : ndarray of shape (n_components,)
    """
    theta, counts = lstsq_by_labels(Z, y, labels[None, :], n_components)
    return theta[0], counts[0]


def lstsq_weighted(
    Z: FloatArray, y: FloatArray, weights: FloatArray, *, row_products: FloatArray | None = None
) -> FloatArray:
    """Weighted least squares of every row of ``weights`` on all samples (EM's M-step).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    weights : ndarray of shape (n_parts, n_samples)
        Non-negative sample weights per part (responsibilities of each line of each start).
    row_products : ndarray, optional
        :attr:`WeightedLeastSquares.products` of ``Z`` and ``y``, read instead of formed.

    Returns
    -------
    theta : ndarray of shape (n_parts, n_params)
    """
    n_parts, n_params = weights.shape[0], Z.shape[1]
    if _shares_products(n_parts, n_params):
        gram, rhs = _weighted_sums(
            Z, y, n_parts, lambda start, stop: weights[:, start:stop], row_products
        )
        return solve_normal_equations(gram, rhs)
    centre = has_intercept_column(Z)
    return weighted_moments(Z, y, weights, centre).solve(centre)


def weighted_moments(Z: FloatArray, y: FloatArray, weights: FloatArray, centre: bool) -> _Moments:
    """Weight, mean and centred scatter of ``[features, y]`` under every row of ``weights``.

    Two passes over the rows: one matrix product gives every part's weighted means; then each
    block of rows is transposed once (columns along the rows, so that every elementwise step
    runs over long contiguous rows), centred on each part's mean and scaled by the square
    roots of the part's weights, and one batched product gives every part's scatter. The
    scatter is centred before it is summed, so it is exact to rounding as :class:`_Moments`
    merges it.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    weights : ndarray of shape (n_parts, n_samples)
        Non-negative.
    centre : bool
        Whether the design's last column is the intercept's (centre on the means and leave
        the column out).
    """
    n_parts, n_samples = weights.shape
    n_x = Z.shape[1] - centre
    moments = _Moments.zeros(n_parts, n_x + 1)
    moments.weight[:] = weights.sum(axis=1)
    if centre:
        safe = np.where(moments.weight > 0.0, moments.weight, 1.0)
        moments.mean[:, :n_x] = (weights @ Z)[:, :n_x] / safe[:, None]
        moments.mean[:, n_x] = (weights @ y) / safe
    root = np.sqrt(weights)
    rows = max(1, _WEIGHTED_BLOCK_ELEMENTS // (n_parts * (n_x + 1)))
    stacked = np.empty((n_parts, n_x + 1, rows))
    for start in range(0, n_samples, rows):
        stop = min(start + rows, n_samples)
        block = stacked[:, :, : stop - start]
        block[0, :n_x] = Z[start:stop, :n_x].T
        block[0, n_x] = y[start:stop]
        # The last part first: part 0's slot holds the raw rows until it is centred itself.
        for part in range(n_parts - 1, -1, -1):
            np.subtract(block[0], moments.mean[part, :, None], out=block[part])
        block *= root[:, None, start:stop]
        moments.scatter += np.matmul(block, block.transpose(0, 2, 1))
    return moments
