"""RANSAC with scikit-learn's ``RANSACRegressor`` semantics, batched over many parts at once.

Per part (a subset of rows), exactly as ``RANSACRegressor()`` with its defaults:

* ``min_samples = n_features + 1`` rows drawn without replacement per trial, fitted by least
  squares (an exact solve when the system is square);
* ``residual_threshold`` = median absolute deviation of the part's ``y``;
* absolute-error loss: a row is an inlier when ``|y - prediction| <= residual_threshold``;
* the best trial has the most inliers, ties broken by the R^2 of the trial's model on its
  inliers (a later trial wins an exact tie);
* at most ``max_trials = 100`` trials, stopped early as soon as the trial count reaches the
  dynamic bound ``log(1 - stop_probability) / log(1 - inlier_ratio ** min_samples)`` with
  ``stop_probability = 0.99``;
* the returned line is the least-squares fit on the best trial's inliers.

Every trial of every part is computed at once (chunked to bound memory) and the sequential
early stop is reproduced afterwards from the per-trial inlier counts and scores. A part with
fewer rows than ``min_samples`` (where ``RANSACRegressor`` would raise) gets its plain
least-squares fit instead.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ._lstsq import WIDE_MIN_PARAMS, lstsq_of_parts

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

MAX_TRIALS = 100
STOP_PROBABILITY = 0.99
# Trials per round; RANSACRegressor stops after about 20 trials on a part with a clear
# consensus, so most parts drop out after a round or two.
_TRIALS_PER_ROUND = 16
# Elements per (parts x trials x rows) block of residuals: bounds memory to ~32 MiB per block.
_BLOCK_ELEMENTS = 1 << 22
_EPSILON = float(np.spacing(1))


def dynamic_max_trials(
    n_inliers: FloatArray, n_samples: FloatArray, min_samples: int, probability: float
) -> FloatArray:
    """Trials needed to draw one all-inlier subset with the given probability (vectorized).

    The same bound as scikit-learn's RANSAC uses to stop early.
    """
    inlier_ratio = n_inliers / n_samples
    nom = max(_EPSILON, 1.0 - probability)
    denom = np.maximum(_EPSILON, 1.0 - inlier_ratio**min_samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        trials = np.ceil(np.log(nom) / np.log(denom))
    bound: FloatArray = np.where(denom == 1.0, np.inf, np.abs(trials))
    if nom == 1.0:
        bound = np.zeros_like(bound)
    return bound


def ransac_lines(
    Z: FloatArray,
    y: FloatArray,
    parts: IntArray,
    sizes: IntArray,
    rng: np.random.Generator,
    *,
    min_samples: int,
    fit_intercept: bool = True,
    max_trials: int = MAX_TRIALS,
    stop_probability: float = STOP_PROBABILITY,
    sample_weight: FloatArray | None = None,
    row_ids: IntArray | None = None,
) -> FloatArray:
    """Fit one robust line per part.

    With ``sample_weight``, a row of weight ``w`` counts as ``w`` rows wherever RANSAC counts
    or sums rows: the threshold is the weighted median absolute deviation, a trial's inliers
    are counted by weight (and so is the early-stop bound's inlier ratio), its R^2 and the
    final least-squares fit are weighted. The minimal subsets are still drawn uniformly from
    the part's rows, so a weighted fit is not the same random draw as one on repeated rows.

    Parameters
    ----------
    Z : ndarray of shape (n_rows, n_params)
        Design matrix (with the intercept column when one is fitted).
    y : ndarray of shape (n_rows,)
    parts : ndarray of shape (n_parts, max_size)
        Row indices of each part; entries at positions ``>= sizes[part]`` are ignored.
    sizes : ndarray of shape (n_parts,)
    rng : numpy.random.Generator
        Source of the random minimal subsets.
    min_samples : int
        Rows per minimal subset (``n_features + 1``).
    fit_intercept : bool
        Whether the last column of ``Z`` is the intercept's column of ones (it is then left
        out of the norm when a minimal subset is singular, as in ``LinearRegression``).
    max_trials, stop_probability
        As in ``RANSACRegressor``.
    sample_weight : ndarray of shape (n_rows,), optional
    row_ids : ndarray of shape (n_rows,), optional
        Equal ids for equal rows of ``Z`` (:func:`equal_row_ids`), so that a minimal subset
        holding one row twice is known singular before it is solved; by default each row is
        taken to be distinct. Only the speed depends on it, never the lines.

    Returns
    -------
    theta : ndarray of shape (n_parts, n_params)
    """
    n_parts, max_size = parts.shape
    theta = np.zeros((n_parts, Z.shape[1]))
    if n_parts == 0:
        return theta
    valid = np.arange(max_size)[None, :] < sizes[:, None]
    row_weights: FloatArray | None = None
    if sample_weight is not None:
        row_weights = np.where(valid, sample_weight[parts], 0.0)
    robust = sizes >= min_samples
    if not robust.all():
        part_rows = valid if row_weights is None else row_weights
        theta[~robust] = lstsq_of_parts(Z, y, parts[~robust], part_rows[~robust])
    robust_idx = np.flatnonzero(robust)
    parts_per_block = max(1, _BLOCK_ELEMENTS // (_TRIALS_PER_ROUND * max(1, max_size)))
    for start in range(0, robust_idx.size, parts_per_block):
        chosen = robust_idx[start : start + parts_per_block]
        width = int(sizes[chosen].max())
        theta[chosen] = _ransac_block(
            Z,
            y,
            parts[chosen, :width],
            (parts if row_ids is None else row_ids[parts])[chosen, :width],
            sizes[chosen],
            valid[chosen, :width],
            rng,
            None if row_weights is None else row_weights[chosen, :width],
            min_samples=min_samples,
            fit_intercept=fit_intercept,
            max_trials=max_trials,
            stop_probability=stop_probability,
        )
    return theta


def _fit_minimal_subsets(
    Zs: FloatArray, ys: FloatArray, fit_intercept: bool, repeated: NDArray[np.bool_]
) -> FloatArray:
    """Least squares on each minimal subset: an exact solve when square and non-singular.

    ``repeated`` marks the subsets that hold one row twice (the sub-sample is drawn with
    replacement, so a part may list a row more than once). Those are the systems that are
    (nearly) singular; they are set aside so that one failing system does not send the whole
    stack through the determinant and a second solve, and are then treated as before: an
    exact solve unless their LU has a zero pivot, least squares then.
    """
    n_rows, n_params = Zs.shape[-2:]
    if n_rows != n_params:
        return _lstsq_like_linear_regression(Zs, ys, fit_intercept)
    if not repeated.any():
        solved = _solve_or_none(Zs, ys)
        return solved if solved is not None else _solve_singular_aside(Zs, ys, fit_intercept)
    # The subsets without a repeated row are solved together; an identity stands in for the
    # others, so their failure cannot fail the stack.
    solved = _solve_or_none(np.where(repeated[..., None, None], np.eye(n_params), Zs), ys)
    if solved is None:
        return _solve_singular_aside(Zs, ys, fit_intercept)
    solved[repeated] = _solve_singular_aside(Zs[repeated], ys[repeated], fit_intercept)
    return solved


def _solve_or_none(Zs: FloatArray, ys: FloatArray) -> FloatArray | None:
    """The exact solve of a stack of square systems, or None when one has a zero pivot."""
    try:
        return np.asarray(np.linalg.solve(Zs, ys[..., None])[..., 0], dtype=np.float64)
    except np.linalg.LinAlgError:
        return None


def _solve_singular_aside(Zs: FloatArray, ys: FloatArray, fit_intercept: bool) -> FloatArray:
    """Exact solves where the determinant is non-zero, least squares on the singular rest."""
    if not Zs.shape[0]:
        return np.zeros(Zs.shape[:-1])
    n_params = Zs.shape[-1]
    det = np.linalg.det(Zs)
    singular = ~np.isfinite(det) | (det == 0.0)
    safe = np.where(singular[..., None, None], np.eye(n_params), Zs)
    theta = np.asarray(np.linalg.solve(safe, ys[..., None])[..., 0], dtype=np.float64)
    theta[singular] = _lstsq_like_linear_regression(Zs[singular], ys[singular], fit_intercept)
    return theta


def _lstsq_like_linear_regression(
    Zs: FloatArray, ys: FloatArray, fit_intercept: bool
) -> FloatArray:
    """Minimum-norm least squares as ``LinearRegression`` computes it, for stacks of problems.

    With an intercept (the last column of ``Zs``) the data are centred first, so the intercept
    is not part of the norm being minimised.
    """
    if not fit_intercept:
        return np.asarray((np.linalg.pinv(Zs) @ ys[..., None])[..., 0], dtype=np.float64)
    X = Zs[..., :-1]
    x_mean = X.mean(axis=-2, keepdims=True)
    y_mean = ys.mean(axis=-1, keepdims=True)
    coef = (np.linalg.pinv(X - x_mean) @ (ys - y_mean)[..., None])[..., 0]
    intercept = y_mean[..., 0] - np.einsum("...p,...p->...", x_mean[..., 0, :], coef)
    theta: FloatArray = np.concatenate([coef, intercept[..., None]], axis=-1)
    return theta


def _ransac_block(
    Z: FloatArray,
    y: FloatArray,
    parts: IntArray,
    part_ids: IntArray,
    sizes: IntArray,
    valid: NDArray[np.bool_],
    rng: np.random.Generator,
    row_weights: FloatArray | None,
    *,
    min_samples: int,
    fit_intercept: bool,
    max_trials: int,
    stop_probability: float,
) -> FloatArray:
    n_parts = parts.shape[0]
    Zp = Z[parts]  # (c, s, p)
    yp = y[parts]  # (c, s)
    if row_weights is None:
        y_masked = np.where(valid, yp, np.nan)
        median = np.nanmedian(y_masked, axis=1, keepdims=True)
        threshold = np.nanmedian(np.abs(y_masked - median), axis=1)  # (c,)
        weighted_sizes: FloatArray | IntArray = sizes
    else:
        median = weighted_median(yp, row_weights)[:, None]
        threshold = weighted_median(np.abs(yp - median), row_weights)
        weighted_sizes = row_weights.sum(axis=1)

    # All trials' subsets are drawn up front (cheap, and the random stream does not depend on
    # when parts stop); the trials run in rounds, and parts whose early-stop bound is reached
    # drop out between rounds, as RANSACRegressor stops its loop.
    picks = _sample_without_replacement(rng, sizes, max_trials, min_samples)  # (c, T, ms)
    # Inlier counts are integers, or with sample weights the inliers' total weight.
    best_count: IntArray | FloatArray = (
        np.zeros(n_parts, dtype=np.intp) if row_weights is None else np.zeros(n_parts)
    )
    best_score = np.full(n_parts, -np.inf)
    # Where no trial finds an inlier (RANSACRegressor would raise), the whole part is used.
    best_inliers = valid.copy()
    active = np.arange(n_parts)
    first = 0
    while active.size and first < max_trials:
        last = min(first + _TRIALS_PER_ROUND, max_trials)
        # No copy of the gathered rows while every part is still active (the first round).
        Za, ya = (Zp, yp) if active.size == n_parts else (Zp[active], yp[active])
        rows = np.arange(active.size)[:, None, None]
        round_picks = picks[active, first:last]
        # The minimal subsets' rows, (a, R, min_samples, p), gathered a few trials at a time:
        # on wide data min_samples is p + 1 and a whole round would be R p^2 per part.
        budget = _BLOCK_ELEMENTS if Za.shape[2] <= WIDE_MIN_PARAMS + 1 else _BLOCK_ELEMENTS >> 3
        per_chunk = max(1, budget // max(1, active.size * min_samples * Za.shape[2]))
        repeated = _repeats_a_row(
            (part_ids if active.size == n_parts else part_ids[active])[rows, round_picks]
        )
        theta = np.concatenate(
            [
                _fit_minimal_subsets(
                    Za[rows, round_picks[:, chunk : chunk + per_chunk]],
                    ya[rows, round_picks[:, chunk : chunk + per_chunk]],
                    fit_intercept,
                    repeated[:, chunk : chunk + per_chunk],
                )
                for chunk in range(0, last - first, per_chunk)
            ],
            axis=1,
        )
        residuals = Za @ theta.transpose(0, 2, 1)  # (a, s, R): one batched product
        np.subtract(ya[:, :, None], residuals, out=residuals)
        inliers = np.abs(residuals) <= threshold[active, None, None]
        inliers &= valid[active, :, None]
        if row_weights is None:
            counts = inliers.sum(axis=1)  # (a, R)
            scores = _r2_on_inliers(residuals, ya, inliers, counts)
        else:
            weights = inliers * row_weights[active, :, None]
            counts = weights.sum(axis=1)
            scores = _r2_on_inliers(residuals, ya, inliers, counts, weights)

        chosen, stopped = _advance(
            counts,
            scores,
            weighted_sizes[active],
            trials_before=first,
            best_count=best_count[active],
            best_score=best_score[active],
            min_samples=min_samples,
            max_trials=max_trials,
            stop_probability=stop_probability,
        )
        improved = np.flatnonzero(chosen >= 0)
        trial = chosen[improved]
        best_count[active[improved]] = counts[improved, trial]
        best_score[active[improved]] = scores[improved, trial]
        best_inliers[active[improved]] = inliers[improved, :, trial]
        active = active[~stopped]
        first = last
    # The gathered rows (and the last round's views and residuals of them) go before the
    # final fits gather the inliers again.
    Zp = Za = residuals = np.empty((0, 0, 0))
    if row_weights is None:
        return lstsq_of_parts(Z, y, parts, best_inliers)
    return lstsq_of_parts(Z, y, parts, best_inliers * row_weights)


def equal_row_ids(Z: FloatArray) -> IntArray:
    """An id per row of ``Z``, equal for equal rows (for a small ``Z``: it sorts the rows)."""
    _, ids = np.unique(Z, axis=0, return_inverse=True)
    row_ids: IntArray = ids.reshape(-1)
    return row_ids


def _repeats_a_row(subset_rows: IntArray) -> NDArray[np.bool_]:
    """Whether each minimal subset (last axis: its row indices) names one row twice."""
    ordered = np.sort(subset_rows, axis=-1)
    repeated: NDArray[np.bool_] = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)
    return repeated


def weighted_median(values: FloatArray, weights: FloatArray) -> FloatArray:
    """Median of each row of ``values`` with each entry counted ``weights`` times.

    With integer weights this is ``np.median`` of the values repeated (the mean of the two
    middle ones when the total weight is even); entries of weight 0 are left out.

    Parameters
    ----------
    values, weights : ndarray of shape (n_parts, n_entries)

    Returns
    -------
    ndarray of shape (n_parts,)
    """
    order = np.argsort(np.where(weights > 0, values, np.inf), axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    cumulative = np.cumsum(np.take_along_axis(weights, order, axis=1), axis=1)
    total = cumulative[:, -1:]
    # 0-based positions of the two middle entries of the repeated values.
    lower = np.argmax(cumulative > np.ceil(total / 2.0) - 1.0, axis=1)
    upper = np.argmax(cumulative > np.floor(total / 2.0), axis=1)
    rows = np.arange(values.shape[0])
    median: FloatArray = 0.5 * (ranked[rows, lower] + ranked[rows, upper])
    return median


def _r2_on_inliers(
    residuals: FloatArray,
    yp: FloatArray,
    inliers: NDArray[np.bool_],
    counts: IntArray | FloatArray,
    weights: FloatArray | None = None,
) -> FloatArray:
    """R^2 of each trial's model on its own inliers (``r2_score`` with ``force_finite``).

    ``residuals`` and ``inliers`` have shape (parts, rows, trials); the result (parts, trials).
    ``weights`` (same shape) are the inliers' sample weights, ``counts`` their sums.
    """
    # Only inliers' residuals (at most the threshold) are squared: an outlier's residual under
    # a line through a near-degenerate minimal subset may overflow when squared.
    squared = np.where(inliers, residuals, 0.0)
    np.square(squared, out=squared)
    if weights is None:
        weights = inliers.astype(np.float64)
    else:
        squared *= weights
    ss_res = squared.sum(axis=1)
    sum_y = (yp[:, None, :] @ weights)[:, 0, :]
    sum_y2 = ((yp * yp)[:, None, :] @ weights)[:, 0, :]
    n = np.where(counts > 0, counts, 1)
    ss_tot = np.maximum(sum_y2 - sum_y * sum_y / n, 0.0)
    # Over a tiny total sum of squares the ratio may overflow: R^2 is then -inf, the worst.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r2 = 1.0 - ss_res / ss_tot
    scores: FloatArray = np.where(ss_tot > 0, r2, np.where(ss_res > 0, 0.0, 1.0))
    return scores


def _sample_without_replacement(
    rng: np.random.Generator, sizes: IntArray, n_trials: int, n_picks: int
) -> IntArray:
    """``n_picks`` distinct positions in ``range(sizes[c])`` for every part and trial.

    Floyd's algorithm, vectorized over parts and trials: step ``j`` draws ``t`` uniformly
    from ``range(size - n_picks + j + 1)`` and keeps it unless already taken, in which case it
    takes ``size - n_picks + j``; every subset is equally likely.
    """
    shape = (sizes.shape[0], n_trials)
    picks = np.empty((*shape, n_picks), dtype=np.intp)
    for step in range(n_picks):
        upper = (sizes - n_picks + step)[:, None]  # largest value this step may take
        drawn = np.floor(rng.random(shape) * (upper + 1)).astype(np.intp)
        taken = (picks[:, :, :step] == drawn[:, :, None]).any(axis=2)
        picks[:, :, step] = np.where(taken, upper, drawn)
    return picks


def _advance(
    counts: IntArray | FloatArray,
    scores: FloatArray,
    sizes: IntArray | FloatArray,
    *,
    trials_before: int,
    best_count: IntArray | FloatArray,
    best_score: FloatArray,
    min_samples: int,
    max_trials: int,
    stop_probability: float,
) -> tuple[IntArray, NDArray[np.bool_]]:
    """Replay one round of RANSACRegressor's sequential trial loop for every part at once.

    Parameters
    ----------
    counts, scores : ndarray of shape (n_parts, n_round)
        Inlier count (total inlier weight, with sample weights) and R^2 of this round's
        trials, in trial order.
    sizes : ndarray of shape (n_parts,)
    trials_before : int
        Trials every part ran in earlier rounds.
    best_count, best_score : ndarray of shape (n_parts,)
        The best trial kept so far (count 0 when none was accepted yet).

    Returns
    -------
    chosen : ndarray of shape (n_parts,)
        Index in this round of the trial that is best when the part stops (or at the round's
        end), or -1 when the best so far is unchanged.
    stopped : ndarray of shape (n_parts,)
        Whether the loop ends within this round.
    """
    n_parts, n_round = counts.shape
    # Position 0 stands for the best trial so far; this round's trials follow it.
    all_counts = np.concatenate([best_count[:, None], counts], axis=1)
    all_scores = np.concatenate([best_score[:, None], scores], axis=1)
    position = np.broadcast_to(np.arange(n_round + 1), all_counts.shape)
    # A trial replaces the best when it has more inliers, or as many and a score at least as
    # high (so among exact ties the later trial wins): rank trials by (count, score, position).
    order = np.lexsort((position, all_scores, all_counts), axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, position, axis=1)
    # RANSACRegressor starts from n_inliers_best = 1: a trial with no inlier is never kept.
    rank = np.where(all_counts > 0, rank, -1)
    running = np.maximum.accumulate(rank, axis=1)[:, 1:]
    running_best = np.take_along_axis(order, np.maximum(running, 0), axis=1)
    accepted = running >= 0
    kept_counts = np.where(accepted, np.take_along_axis(all_counts, running_best, axis=1), 1)
    bound = dynamic_max_trials(
        kept_counts.astype(np.float64),
        sizes[:, None].astype(np.float64),
        min_samples,
        stop_probability,
    )
    # RANSACRegressor only tightens max_trials when it accepts a trial.
    bound = np.where(accepted, bound, np.inf)
    trial_number = trials_before + np.arange(1, n_round + 1)
    done = trial_number[None, :] >= np.minimum(bound, max_trials)
    stopped: NDArray[np.bool_] = np.asarray(done.any(axis=1))
    end = np.where(stopped, np.argmax(done, axis=1), n_round - 1)
    rows = np.arange(n_parts)
    chosen: IntArray = np.where(accepted[rows, end], running_best[rows, end] - 1, -1)
    return chosen, stopped


def _sequential_best(
    counts: IntArray,
    scores: FloatArray,
    sizes: IntArray,
    min_samples: int,
    max_trials: int,
    stop_probability: float,
) -> IntArray:
    """Index of the trial the sequential RANSAC loop keeps (-1 if none has an inlier).

    ``counts`` and ``scores`` hold all ``max_trials`` trials of every part.
    """
    chosen, _ = _advance(
        counts,
        scores,
        sizes,
        trials_before=0,
        best_count=np.zeros(counts.shape[0], dtype=np.intp),
        best_score=np.full(counts.shape[0], -np.inf),
        min_samples=min_samples,
        max_trials=max_trials,
        stop_probability=stop_probability,
    )
    return chosen
