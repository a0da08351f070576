"""Solving stacks of normal equations: equilibrated, by Cholesky where well conditioned, by an
eigendecomposition (the minimum-norm answer) where a matrix is singular or nearly so.

Every least-squares path of the package (:mod:`mixreg._lstsq`, the partitions' running moments
of :mod:`mixreg._partition_moments`, keyed fits, EM's M-steps) ends in these solves.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import LinAlgError, cho_factor, cho_solve

FloatArray = NDArray[np.float64]

# Eigenvalues of the (equilibrated) Gram matrix below this fraction of the largest are treated
# as zero: the solve then returns the minimum-norm solution on the remaining directions.
_RCOND = 1e-12

# Up to this many parameters, a stack of normal equations is solved by one batched eigh;
# above it, each by a Cholesky factorization (ten times cheaper), eigh where it fails.
_BATCHED_EIGH_MAX_PARAMS = 64


def solve_normal_equations(gram: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve a stack of normal equations ``gram @ theta = rhs`` (pseudo-inverse where singular).

    The Gram matrices are equilibrated (scaled to unit diagonal) first, so features of very
    different scales do not lose precision; directions with a negligible eigenvalue get a zero
    coefficient, which gives a finite answer for empty, tiny or collinear parts. Large
    matrices are factorized by Cholesky where it is well conditioned.

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
    if gram.shape[-1] > _BATCHED_EIGH_MAX_PARAMS:
        return (
            np.stack([_solve_one(g, r) for g, r in zip(gram, rhs, strict=True)])
            if gram.shape[0]
            else np.zeros(rhs.shape)
        )
    solved = _solve_well_conditioned(gram, rhs)
    if solved is not None:
        return solved
    eigvecs, inverse_eigvals, scale = _equilibrated_spectrum(gram)
    projected = np.einsum("pji,pj->pi", eigvecs, rhs * scale)
    theta: FloatArray = np.einsum("pij,pj->pi", eigvecs, projected * inverse_eigvals) * scale
    return theta


# A stack whose equilibrated matrices all have Cholesky pivots within this ratio (squared) of
# each other is well conditioned (condition number below about 1e6): a direct solve gives the
# eigh path's answer to rounding, in a few calls instead of an eigendecomposition and its
# bookkeeping (on small data, per-call overhead sets EM's and AM's time).
_WELL_CONDITIONED_PIVOT_RATIO = 1e-6


def _solve_well_conditioned(gram: FloatArray, rhs: FloatArray) -> FloatArray | None:
    """The equilibrated direct solve of a stack of normal equations, or None when one of them
    is not clearly positive definite (the eigh path then handles the whole stack)."""
    diag = np.einsum("pii->pi", gram)
    if not gram.shape[0] or not bool((diag > 0).all()):
        return None
    scale = 1.0 / np.sqrt(diag)
    equilibrated = gram * scale[:, :, None] * scale[:, None, :]
    try:
        pivots = np.einsum("pii->pi", np.linalg.cholesky(equilibrated))
    except LinAlgError:
        return None
    pivots = pivots * pivots
    if not bool((pivots.min(axis=1) > _WELL_CONDITIONED_PIVOT_RATIO * pivots.max(axis=1)).all()):
        return None
    theta: FloatArray = np.linalg.solve(equilibrated, (rhs * scale)[:, :, None])[:, :, 0] * scale
    return theta


def _solve_one(gram: FloatArray, rhs: FloatArray) -> FloatArray:
    """One large system: Cholesky of the equilibrated matrix, eigh if it is near singular."""
    diag = np.diag(gram)
    if not np.any(diag > 0):
        return np.zeros(rhs.shape)
    scale = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)
    equilibrated = gram * scale[:, None] * scale[None, :]
    if np.all(diag > 0):
        try:
            factor = cho_factor(equilibrated, lower=True, check_finite=False)
            pivots = np.abs(np.diag(factor[0]))
            if pivots.min() ** 2 > 1e-8 * pivots.max() ** 2:
                solution: FloatArray = cho_solve(factor, rhs * scale, check_finite=False) * scale
                return solution
        except LinAlgError:
            pass
    eigvecs, inverse_eigvals, _ = _equilibrated_spectrum(gram[None])
    theta: FloatArray = (eigvecs[0] @ ((eigvecs[0].T @ (rhs * scale)) * inverse_eigvals[0])) * scale
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
