"""Batched least squares: many small solves at once, rank deficiency handled without NaN."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# Eigenvalues of the (equilibrated) Gram matrix below this fraction of the largest are treated
# as zero: the solve then returns the minimum-norm solution on the remaining directions.
_RCOND = 1e-12
# Rows per block when accumulating Gram matrices over all samples.
_GRAM_BLOCK_ROWS = 1 << 16
# Elements of the one-hot membership (or outer-product) block when many partitions are
# accumulated at once: 2^20 float64 values, 8 MiB.
_MEMBERSHIP_BLOCK_ELEMENTS = 1 << 20


def solve_normal_equations(gram: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve a stack of normal equations ``gram @ theta = rhs`` (pseudo-inverse where singular).

    The Gram matrices are equilibrated (scaled to unit diagonal) first, so features of very
    different scales do not lose precision; directions with a negligible eigenvalue get a zero
    coefficient, which gives a finite answer for empty, tiny or collinear parts.

    Parameters
    ----------
    gram : ndarray of shape (n_problems, n_params, n_params)
        Symmetric positive semi-definite matrices ``Z_P^T Z_P``.
    rhs : ndarray of shape (n_problems, n_params)
        ``Z_P^T y_P``.

    Returns
    -------
    theta : ndarray of shape (n_problems, n_params)
    """
    eigvecs, inverse_eigvals, scale = _equilibrated_spectrum(gram)
    projected = np.einsum("pji,pj->pi", eigvecs, rhs * scale)
    theta: FloatArray = np.einsum("pij,pj->pi", eigvecs, projected * inverse_eigvals) * scale
    return theta


def pseudo_inverse(gram: FloatArray) -> FloatArray:
    """Pseudo-inverse of one symmetric positive semi-definite matrix, as the solves above.

    Parameters
    ----------
    gram : ndarray of shape (n_params, n_params)

    Returns
    -------
    ndarray of shape (n_params, n_params)
    """
    eigvecs, inverse_eigvals, scale = _equilibrated_spectrum(gram[None])
    inverse: FloatArray = (eigvecs[0] * inverse_eigvals[0]) @ eigvecs[0].T
    inverse *= scale[0][:, None] * scale[0][None, :]
    return inverse


def _equilibrated_spectrum(gram: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Eigenvectors, inverted eigenvalues (0 where negligible) and the equilibration scale."""
    diag = np.einsum("pii->pi", gram)
    scale = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)
    equilibrated = gram * scale[:, :, None] * scale[:, None, :]
    eigvals, eigvecs = np.linalg.eigh(equilibrated)
    cutoff = _RCOND * np.maximum(eigvals[:, -1:], 0.0)
    keep = eigvals > np.maximum(cutoff, np.finfo(np.float64).tiny)
    inverse_eigvals = np.where(keep, 1.0 / np.where(keep, eigvals, 1.0), 0.0)
    return eigvecs, inverse_eigvals, scale


def lstsq_weighted_subsets(Z: FloatArray, y: FloatArray, membership: FloatArray) -> FloatArray:
    """Least squares on many subsets of the same few rows, in one matrix product.

    Parameters
    ----------
    Z : ndarray of shape (m, n_params)
        The rows (e.g. the sub-sample A).
    y : ndarray of shape (m,)
    membership : ndarray of shape (n_problems, m)
        1.0 where a row belongs to the subset, 0.0 elsewhere (row multiplicities allowed).

    Returns
    -------
    theta : ndarray of shape (n_problems, n_params)
    """
    n_params = Z.shape[1]
    outer = (Z[:, :, None] * Z[:, None, :]).reshape(Z.shape[0], n_params * n_params)
    gram = (membership @ outer).reshape(-1, n_params, n_params)
    rhs = membership @ (Z * y[:, None])
    return solve_normal_equations(gram, rhs)


def _weighted_sums(
    Z: FloatArray,
    y: FloatArray,
    n_parts: int,
    weights_of_rows: Callable[[int, int], FloatArray],
) -> tuple[FloatArray, FloatArray]:
    """``sum_i w_pi z_i z_i^T`` and ``sum_i w_pi z_i y_i`` for many parts ``p`` at once.

    With many parts, each block of rows' outer products is formed once and shared by every
    part in one matrix product (only the upper triangle: Gram matrices are symmetric; the
    right-hand sides ride along as extra columns); with few, each part is a weighted product.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    n_parts : int
    weights_of_rows : callable
        ``weights_of_rows(start, stop)`` gives the weights of rows ``start:stop``, shape
        ``(n_parts, stop - start)``.

    Returns
    -------
    gram : ndarray of shape (n_parts, n_params, n_params)
    rhs : ndarray of shape (n_parts, n_params)
    """
    n_samples, n_params = Z.shape
    if n_parts <= n_params:
        gram = np.zeros((n_parts, n_params, n_params))
        rhs = np.zeros((n_parts, n_params))
        for start in range(0, n_samples, _GRAM_BLOCK_ROWS):
            stop = min(start + _GRAM_BLOCK_ROWS, n_samples)
            Zb, weights = Z[start:stop], weights_of_rows(start, stop)
            for part in range(n_parts):
                weighted = Zb * weights[part][:, None]
                gram[part] += weighted.T @ Zb
                rhs[part] += weighted.T @ y[start:stop]
        return gram, rhs
    upper_rows, upper_cols = np.triu_indices(n_params)
    n_upper = upper_rows.size
    sums = np.zeros((n_parts, n_upper + n_params))
    block_rows = max(1, _MEMBERSHIP_BLOCK_ELEMENTS // max(n_parts, n_upper + n_params))
    for start in range(0, n_samples, block_rows):
        stop = min(start + block_rows, n_samples)
        Zb = Z[start:stop]
        products = np.concatenate(
            [Zb[:, upper_rows] * Zb[:, upper_cols], Zb * y[start:stop, None]], axis=1
        )
        sums += weights_of_rows(start, stop) @ products
    gram = np.empty((n_parts, n_params, n_params))
    gram[:, upper_rows, upper_cols] = sums[:, :n_upper]
    gram[:, upper_cols, upper_rows] = sums[:, :n_upper]
    return gram, sums[:, n_upper:]


def normal_equations_by_label(
    Z: FloatArray, y: FloatArray, labels: NDArray[np.intp], n_components: int
) -> tuple[FloatArray, FloatArray, NDArray[np.intp]]:
    """Gram matrices and right-hand sides of every part of many partitions of all rows.

    One partition (a row of ``labels``) is accumulated part by part over row blocks, from the
    rows of each part; several at once as :func:`_weighted_sums` of their one-hot
    memberships, a few matrix products instead of a Python loop per partition and part.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_partitions, n_samples)
        The part of each row, in ``range(n_components)``, for each partition.
    n_components : int

    Returns
    -------
    gram : ndarray of shape (n_partitions, n_components, n_params, n_params)
    rhs : ndarray of shape (n_partitions, n_components, n_params)
    counts : ndarray of shape (n_partitions, n_components)
    """
    n_partitions, n_samples = labels.shape
    n_params = Z.shape[1]
    if n_partitions == 1:
        gram = np.zeros((1, n_components, n_params, n_params))
        rhs = np.zeros((1, n_components, n_params))
        for start in range(0, n_samples, _GRAM_BLOCK_ROWS):
            block = slice(start, start + _GRAM_BLOCK_ROWS)
            Zb, yb, lb = Z[block], y[block], labels[0, block]
            for component in range(n_components):
                rows = lb == component
                Zc = Zb[rows]
                gram[0, component] += Zc.T @ Zc
                rhs[0, component] += Zc.T @ yb[rows]
        counts = np.bincount(labels[0], minlength=n_components)[None, :]
        return gram, rhs, counts
    n_parts = n_partitions * n_components
    parts = np.arange(n_components)[None, :, None]
    counts_sum = np.zeros(n_parts)

    def membership(start: int, stop: int) -> FloatArray:
        one_hot = (labels[:, None, start:stop] == parts).reshape(n_parts, stop - start)
        weights: FloatArray = one_hot.astype(np.float64)
        counts_sum[:] += weights.sum(axis=1)
        return weights

    gram, rhs = _weighted_sums(Z, y, n_parts, membership)
    return (
        gram.reshape(n_partitions, n_components, n_params, n_params),
        rhs.reshape(n_partitions, n_components, n_params),
        np.rint(counts_sum).astype(np.intp).reshape(n_partitions, n_components),
    )


def lstsq_by_labels(
    Z: FloatArray, y: FloatArray, labels: NDArray[np.intp], n_components: int
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Least squares of each part of many partitions of all rows.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    labels : ndarray of shape (n_partitions, n_samples)
    n_components : int

    Returns
    -------
    theta : ndarray of shape (n_partitions, n_components, n_params)
        A part with no rows gets zeros; callers decide what to keep instead.
    counts : ndarray of shape (n_partitions, n_components)
    """
    gram, rhs, counts = normal_equations_by_label(Z, y, labels, n_components)
    n_params = Z.shape[1]
    theta = solve_normal_equations(gram.reshape(-1, n_params, n_params), rhs.reshape(-1, n_params))
    return theta.reshape(rhs.shape), counts


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


def lstsq_weighted(Z: FloatArray, y: FloatArray, weights: FloatArray) -> FloatArray:
    """Weighted least squares of every row of ``weights`` on all samples (EM's M-step).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    weights : ndarray of shape (n_parts, n_samples)
        Non-negative sample weights per part (responsibilities of each line of each start).

    Returns
    -------
    theta : ndarray of shape (n_parts, n_params)
    """
    gram, rhs = _weighted_sums(Z, y, weights.shape[0], lambda start, stop: weights[:, start:stop])
    return solve_normal_equations(gram, rhs)
