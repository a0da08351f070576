"""The sub-sample algorithms: exhaustive (Algorithm 2) and random partitions (Algorithm 3)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
from numpy.typing import NDArray

from ._am import SolverResult
from ._loss import CandidateScorer, assign, weighted_mean
from ._lstsq import lstsq_by_labels
from ._partition_moments import refit_exactly
from ._ransac import equal_row_ids, ransac_lines

# Algorithm 2 refuses to enumerate more partitions than this.
MAX_EXHAUSTIVE_PARTITIONS = 100_000
# With one line there is one partition of any sub-sample: its default size is then the other
# sub-sample algorithms' default.
DEFAULT_EXHAUSTIVE_SIZE_LIMIT = 150

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
ChunkCallback = Callable[[int, float], None]
"""Called after every batch of candidates with (candidates tried, best min-loss so far)."""

BASES = ("ls", "ransac")
# Candidate partitions handled per batch: bounds memory and sets how often the time budget
# and the progress callback are checked.
_PARTITIONS_PER_BATCH = 128
_BATCH_LABELS = 1 << 20


def stirling2(n: int, k: int) -> int:
    """Number of partitions of ``n`` labelled items into ``k`` non-empty unlabelled parts.

    Computed row by row (``S(m, j) = j S(m-1, j) + S(m-1, j-1)``) in ``O(n k)`` integer
    operations, without recursion.
    """
    return _stirling2_row(n, k, cap=None)


def capped_stirling2(n: int, k: int, cap: int) -> int:
    """``min(stirling2(n, k), cap + 1)``: whether the count exceeds ``cap``, cheaply.

    ``S(m, k)`` never decreases with ``m``, so the rows stop as soon as the count passes
    ``cap``; the numbers stay small whatever ``n``.
    """
    return _stirling2_row(n, k, cap=cap)


def _stirling2_row(n: int, k: int, cap: int | None) -> int:
    if k == 0 or k > n:
        return int(n == k)
    if k == 1:
        # One part: one partition, whatever n (rows of it would take n steps to say so).
        return 1
    row = [1] + [0] * k  # S(0, j)
    for m in range(1, n + 1):
        _next_stirling2_row(row, m, k, cap)
        if cap is not None and row[k] > cap:
            return cap + 1
    return row[k]


def _next_stirling2_row(row: list[int], m: int, k: int, cap: int | None) -> None:
    """Turn ``row`` (``S(m - 1, j)`` for j = 0..k) into ``S(m, j)``, each at most ``cap + 1``."""
    for j in range(min(m, k), 0, -1):
        row[j] = j * row[j] + row[j - 1]
        if cap is not None:
            row[j] = min(row[j], cap + 1)
    row[0] = 0


def largest_enumerable_size(n_components: int, cap: int, limit: int) -> int:
    """Largest sub-sample size, at most ``limit``, whose partition count is at most ``cap``.

    With one part every size has exactly one partition, so the answer is ``limit``. With more,
    ``S(m, k)`` at least doubles with each row past ``k``: one pass of rows, each of ``k``
    numbers at most ``cap + 1``, stops after about ``k + log2(cap)`` of them, whatever
    ``limit``.
    """
    if n_components == 1:
        return max(limit, 1)
    row = [1] + [0] * n_components
    for m in range(1, n_components + 1):
        _next_stirling2_row(row, m, n_components, cap)
    size = n_components
    while size < limit:
        _next_stirling2_row(row, size + 1, n_components, cap)
        if row[n_components] > cap:
            break
        size += 1
    return size


def exhaustive_subsample_size(n_components: int, subsample_size: int | None) -> int:
    """The sub-sample size of Algorithm 2: ``subsample_size``, or by default the largest whose
    partitions into ``n_components`` parts number at most :data:`MAX_EXHAUSTIVE_PARTITIONS`.

    Raises ValueError, saying what to use instead, when ``subsample_size`` has more.
    """
    k = n_components
    largest = largest_enumerable_size(
        k, MAX_EXHAUSTIVE_PARTITIONS, limit=DEFAULT_EXHAUSTIVE_SIZE_LIMIT
    )
    size = largest if subsample_size is None else subsample_size
    if capped_stirling2(size, k, MAX_EXHAUSTIVE_PARTITIONS) > MAX_EXHAUSTIVE_PARTITIONS:
        raise ValueError(
            f"subsample-exhaustive would try more than {MAX_EXHAUSTIVE_PARTITIONS:,} "
            f"partitions (the cap) of subsample_size={size} rows into {k} parts; use "
            f"subsample_size <= {largest}, or algorithm='subsample', which tries "
            f"n_partitions random partitions"
        )
    return size


def all_partitions(size: int, n_components: int) -> IntArray:
    """Every partition of ``range(size)`` into exactly ``n_components`` non-empty parts.

    Each partition is written once, as a restricted growth string: item 0 is in part 0 and
    each item joins an existing part or opens the next one.

    Returns
    -------
    labels : ndarray of shape (stirling2(size, n_components), size)
    """
    if n_components == 1:
        # One part: the one partition, whatever the size.
        return np.zeros((1, size), dtype=np.intp)
    prefixes = np.zeros((1, 1), dtype=np.intp)
    n_parts = np.ones(1, dtype=np.intp)
    for position in range(1, size):
        remaining = size - position - 1
        grown, grown_parts = [], []
        for label in range(n_components):
            opens = label == n_parts
            allowed = (label < n_parts) | (opens & (n_parts < n_components))
            parts_after = n_parts + opens
            # Prune prefixes that can no longer reach n_components parts.
            allowed &= parts_after + remaining >= n_components
            chosen = np.flatnonzero(allowed)
            grown.append(
                np.column_stack([prefixes[chosen], np.full(chosen.size, label, dtype=np.intp)])
            )
            grown_parts.append(parts_after[chosen])
        prefixes = np.concatenate(grown)
        n_parts = np.concatenate(grown_parts)
    complete: IntArray = prefixes[n_parts == n_components]
    return complete


def random_partitions(
    rng: np.random.Generator, n_partitions: int, size: int, n_components: int
) -> IntArray:
    """``n_partitions`` random partitions of ``range(size)``: each item's part drawn uniformly."""
    labels: IntArray = rng.integers(0, n_components, size=(n_partitions, size))
    return labels


def parts_from_labels(labels: IntArray, n_components: int) -> tuple[IntArray, IntArray]:
    """Row indices of every part of every partition, padded to a rectangle.

    Returns
    -------
    parts : ndarray of shape (n_partitions * n_components, max_part_size)
    sizes : ndarray of shape (n_partitions * n_components,)
    """
    n_partitions, size = labels.shape
    flat_part = (np.arange(n_partitions)[:, None] * n_components + labels).ravel()
    sizes = np.bincount(flat_part, minlength=n_partitions * n_components)
    order = np.argsort(flat_part, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    sorted_parts = flat_part[order]
    position = np.arange(order.size) - starts[sorted_parts]
    parts = np.zeros((n_partitions * n_components, max(1, int(sizes.max()))), dtype=np.intp)
    parts[sorted_parts, position] = order % size
    return parts, sizes


def fit_candidates(
    Z: FloatArray,
    y: FloatArray,
    labels: IntArray,
    n_components: int,
    *,
    base: str,
    rng: np.random.Generator,
    min_samples: int,
    fit_intercept: bool = True,
) -> FloatArray:
    """One line per part of every partition of the sub-sample: a candidate line set each.

    Parameters
    ----------
    Z, y : the sub-sample A.
    labels : ndarray of shape (n_partitions, |A|)

    Returns
    -------
    candidates : ndarray of shape (n_partitions, n_components, n_params)
    """
    n_partitions = labels.shape[0]
    if base == "ls":
        theta, _ = lstsq_by_labels(Z, y, labels, n_components)
    else:
        parts, sizes = parts_from_labels(labels, n_components)
        # The sub-sample is drawn with replacement: its repeated rows are told apart up front.
        theta = ransac_lines(
            Z,
            y,
            parts,
            sizes,
            rng,
            min_samples=min_samples,
            fit_intercept=fit_intercept,
            row_ids=equal_row_ids(Z),
        )
    return theta.reshape(n_partitions, n_components, Z.shape[1])


def refit(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    base: str,
    rng: np.random.Generator,
    min_samples: int,
    fit_intercept: bool = True,
    sample_weight: FloatArray | None = None,
) -> FloatArray:
    """Refit each line on the rows it wins, with the same base fit (weighted, with weights).

    A line that wins no rows keeps its candidate value.
    """
    n_components = theta.shape[0]
    _, labels = assign(Z, y, theta)
    if base == "ls":
        fitted, counts = refit_exactly(Z, y, labels, n_components, sample_weight=sample_weight)
    else:
        parts, counts = parts_from_labels(labels[None, :], n_components)
        fitted = ransac_lines(
            Z,
            y,
            parts,
            counts,
            rng,
            min_samples=min_samples,
            fit_intercept=fit_intercept,
            sample_weight=sample_weight,
        )
    refitted: FloatArray = np.where((counts > 0)[:, None], fitted, theta)
    return refitted


def subsample_search(
    Z: FloatArray,
    y: FloatArray,
    partitions: Iterator[IntArray],
    *,
    subsample: IntArray,
    n_components: int,
    base: str,
    rng: np.random.Generator,
    min_samples: int,
    fit_intercept: bool = True,
    deadline: float | None = None,
    callback: ChunkCallback | None = None,
    sample_weight: FloatArray | None = None,
) -> SolverResult:
    """Algorithms 2 and 3: fit candidates on partitions of A, keep the best on all rows, refit.

    With ``sample_weight``, candidates are scored by the weighted min-loss and refitted by
    weighted fits; the sub-sample itself is expected drawn in proportion to the weights (its
    rows then count once each).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    partitions : iterator of ndarray of shape (batch, |A|)
        Batches of partitions of the sub-sample (labels in ``range(n_components)``).
    subsample : ndarray of shape (|A|,)
        Row indices of the sub-sample A.
    deadline : float, optional
        ``time.monotonic()`` value after which no further batch is started (at least one
        batch always runs).

    Returns
    -------
    SolverResult
        ``loss_history`` holds the best candidate's min-loss after each batch, then the
        min-loss after the refit; ``n_iter`` and ``n_candidates`` count the candidates tried;
        ``converged`` says whether every partition was tried (not when the deadline cut the
        search short).
    """
    Z_sub, y_sub = Z[subsample], y[subsample]
    scorer = CandidateScorer(Z, y, sample_weight)
    best_theta: FloatArray | None = None
    best_loss = np.inf
    result = SolverResult(theta=np.zeros((n_components, Z.shape[1])))
    for labels in partitions:
        candidates = fit_candidates(
            Z_sub,
            y_sub,
            labels,
            n_components,
            base=base,
            rng=rng,
            min_samples=min_samples,
            fit_intercept=fit_intercept,
        )
        winner, loss = scorer.best(candidates)
        if loss < best_loss:
            best_loss = loss
            best_theta = candidates[winner]
        result.n_candidates += labels.shape[0]
        result.loss_history.append(best_loss)
        if callback is not None:
            callback(result.n_candidates, best_loss)
        if deadline is not None and time.monotonic() > deadline:
            break
    else:
        # Every partition was tried: the search ran to its end, not to the time budget's.
        result.converged = True
    if best_theta is None:
        raise ValueError("no partition of the sub-sample was tried")
    result.theta = refit(
        Z,
        y,
        best_theta,
        base=base,
        rng=rng,
        min_samples=min_samples,
        fit_intercept=fit_intercept,
        sample_weight=sample_weight,
    )
    residuals, labels = assign(Z, y, result.theta)
    best = residuals[labels, np.arange(Z.shape[0])]
    if sample_weight is None:
        result.loss_history.append(float(best @ best) / Z.shape[0])
    else:
        result.loss_history.append(float(weighted_mean(best * best, sample_weight)))
    result.n_iter = result.n_candidates
    return result


def random_partition_batches(
    rng: np.random.Generator, n_partitions: int, size: int, n_components: int
) -> Iterator[IntArray]:
    """Algorithm 3's ``n_partitions`` random partitions, in batches."""
    per_batch = _partitions_per_batch(size)
    for start in range(0, n_partitions, per_batch):
        count = min(per_batch, n_partitions - start)
        yield random_partitions(rng, count, size, n_components)


def exhaustive_partition_batches(size: int, n_components: int) -> Iterator[IntArray]:
    """Algorithm 2's partitions (all of them), in batches."""
    labels = all_partitions(size, n_components)
    per_batch = _partitions_per_batch(size)
    for start in range(0, labels.shape[0], per_batch):
        yield labels[start : start + per_batch]


def _partitions_per_batch(size: int) -> int:
    """Partitions per batch: at most 128, and at most 2^20 labels (8 MiB) however large A."""
    return max(1, min(_PARTITIONS_PER_BATCH, _BATCH_LABELS // max(size, 1)))
