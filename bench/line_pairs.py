"""The line-pair search: a near-exhaustive reference for two lines on one feature.

Every line through two training points (pairs of points with the same x, which only a vertical
line joins, are left out) and the flat line through each point are the candidates; every pair
of candidates is scored by its min-loss on all the training rows, and the best pairs are
polished by classical AM (``mixreg._am.classic_am_batch``). It needs no random start, and its
cost grows like n^5 / 8 row evaluations for n rows, so it is only run on small one-feature
data sets; it is the benchmark's reference for how low a training min-loss can go there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mixreg._am import classic_am_batch

FloatArray = NDArray[np.float64]

N_POLISHED = 300
POLISH_MAX_ITER = 200


@dataclass(frozen=True)
class LinePairResult:
    """The best pair of lines found, and what it took.

    Attributes
    ----------
    coef : ndarray of shape (2, 1)
    intercept : ndarray of shape (2,)
    min_loss : float
        Training min-loss of ``coef`` and ``intercept`` after polishing.
    best_pair_loss : float
        Training min-loss of the best candidate pair before polishing.
    n_lines : int
        Distinct candidate lines m.
    n_pairs : int
        Pairs scored, m (m - 1) / 2.
    n_polished : int
        Best pairs polished by classical AM.
    seconds : float
        Wall time of the whole search.
    """

    coef: FloatArray
    intercept: FloatArray
    min_loss: float
    best_pair_loss: float
    n_lines: int
    n_pairs: int
    n_polished: int
    seconds: float


def candidate_lines(x: FloatArray, y: FloatArray) -> FloatArray:
    """Distinct lines through two points of (x, y), and the flat line through each point.

    Returns
    -------
    lines : ndarray of shape (m, 2)
        Slope and intercept of each line.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    first, second = np.triu_indices(len(y), 1)
    keep = x[first] != x[second]
    first, second = first[keep], second[keep]
    slopes = (y[second] - y[first]) / (x[second] - x[first])
    intercepts = y[first] - slopes * x[first]
    lines = np.concatenate(
        [np.column_stack([slopes, intercepts]), np.column_stack([np.zeros_like(y), y])]
    )
    return np.unique(lines, axis=0)


def pair_cost(n_lines: int, n_samples: int) -> float:
    """Row evaluations of scoring every pair of ``n_lines`` lines on ``n_samples`` rows."""
    return n_lines * (n_lines - 1) / 2 * n_samples


def best_pairs(squared: NDArray[np.float32], n_best: int) -> tuple[NDArray[np.intp], FloatArray]:
    """The ``n_best`` pairs of lines with the lowest summed min of squared residuals.

    Parameters
    ----------
    squared : ndarray of shape (m, n_samples)
        Squared residual of every line on every row.
    n_best : int

    Returns
    -------
    pairs : ndarray of shape (min(n_best, m (m - 1) / 2), 2)
        Line indices (first < second), best pair first.
    sums : ndarray
        Their summed min of squared residuals (in ``squared``'s precision).
    """
    n_lines = squared.shape[0]
    pairs = np.empty((0, 2), dtype=np.intp)
    sums = np.empty(0, dtype=np.float64)
    threshold = np.inf
    buffer = np.empty_like(squared)
    for first in range(n_lines - 1):
        rest = buffer[: n_lines - first - 1]
        np.minimum(squared[first], squared[first + 1 :], out=rest)
        totals = rest.sum(axis=1)
        better = np.flatnonzero(totals < threshold)
        if better.size == 0:
            continue
        pairs = np.concatenate(
            [pairs, np.column_stack([np.full(better.size, first), better + first + 1])]
        )
        sums = np.concatenate([sums, totals[better].astype(np.float64)])
        if sums.size > n_best:
            kept = np.argpartition(sums, n_best - 1)[:n_best]
            pairs, sums = pairs[kept], sums[kept]
        if sums.size == n_best:
            threshold = sums.max()
    order = np.argsort(sums, kind="stable")
    return pairs[order], sums[order]


def line_pair_search(
    x: FloatArray,
    y: FloatArray,
    *,
    n_polished: int = N_POLISHED,
    max_iter: int = POLISH_MAX_ITER,
) -> LinePairResult:
    """Score every pair of candidate lines, then polish the best pairs by classical AM.

    Parameters
    ----------
    x : ndarray of shape (n_samples,)
        The one feature.
    y : ndarray of shape (n_samples,)
    n_polished : int
        Best pairs (by the min-loss of the pair as drawn) handed to classical AM.
    max_iter : int
        Classical AM refits per pair at most (run with ``tol = 0``: until the partition stops
        changing).

    Returns
    -------
    LinePairResult
    """
    started = time.perf_counter()
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    lines = candidate_lines(x, y)
    if len(lines) < 2:
        raise ValueError("the line-pair search needs at least two distinct candidate lines")
    Z = np.column_stack([x, np.ones_like(x)])
    squared = ((y - lines @ Z.T) ** 2).astype(np.float32)
    pairs, sums = best_pairs(squared, n_polished)
    batch = classic_am_batch(Z, y, lines[pairs], max_iter=max_iter, tol=0.0)
    losses = batch.losses
    best = int(np.argmin(losses))
    theta = batch.thetas[best]
    return LinePairResult(
        coef=theta[:, :1].copy(),
        intercept=theta[:, 1].copy(),
        min_loss=float(losses[best]),
        best_pair_loss=float(sums[0]) / len(y),
        n_lines=len(lines),
        n_pairs=len(lines) * (len(lines) - 1) // 2,
        n_polished=len(pairs),
        seconds=time.perf_counter() - started,
    )
