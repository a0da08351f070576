"""Batched least squares: many small solves at once, rank deficiency handled without NaN."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# Eigenvalues of the (equilibrated) Gram matrix below this fraction of the largest are treated
# as zero: the solve then returns the minimum-norm solution on the remaining directions.
_RCOND = 1e-12
# Rows per block when accumulating Gram matrices over all samples.
_GRAM_BLOCK_ROWS = 1 << 16


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
    diag = np.einsum("pii->pi", gram)
    scale = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)
    equilibrated = gram * scale[:, :, None] * scale[:, None, :]
    eigvals, eigvecs = np.linalg.eigh(equilibrated)
    cutoff = _RCOND * np.maximum(eigvals[:, -1:], 0.0)
    keep = eigvals > np.maximum(cutoff, np.finfo(np.float64).tiny)
    inv = np.where(keep, 1.0 / np.where(keep, eigvals, 1.0), 0.0)
    projected = np.einsum("pji,pj->pi", eigvecs, rhs * scale)
    theta: FloatArray = np.einsum("pij,pj->pi", eigvecs, projected * inv) * scale
    return theta


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
    n_params = Z.shape[1]
    gram = np.zeros((n_components, n_params, n_params))
    rhs = np.zeros((n_components, n_params))
    for start in range(0, Z.shape[0], _GRAM_BLOCK_ROWS):
        block = slice(start, start + _GRAM_BLOCK_ROWS)
        Zb, yb, lb = Z[block], y[block], labels[block]
        for component in range(n_components):
            rows = lb == component
            Zc = Zb[rows]
            gram[component] += Zc.T @ Zc
            rhs[component] += Zc.T @ yb[rows]
    counts = np.bincount(labels, minlength=n_components)
    return solve_normal_equations(gram, rhs), counts


def lstsq_weighted(Z: FloatArray, y: FloatArray, weights: FloatArray) -> FloatArray:
    """Weighted least squares of every row of ``weights`` on all samples (EM's M-step).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    weights : ndarray of shape (n_components, n_samples)
        Non-negative sample weights per component (responsibilities).

    Returns
    -------
    theta : ndarray of shape (n_components, n_params)
    """
    n_params = Z.shape[1]
    n_components = weights.shape[0]
    gram = np.zeros((n_components, n_params, n_params))
    for start in range(0, Z.shape[0], _GRAM_BLOCK_ROWS):
        Zb = Z[start : start + _GRAM_BLOCK_ROWS]
        wb = weights[:, start : start + _GRAM_BLOCK_ROWS]
        for component in range(n_components):
            gram[component] += (Zb * wb[component][:, None]).T @ Zb
    rhs = (weights * y) @ Z
    return solve_normal_equations(gram, rhs)
