"""The maximum-likelihood fit behind every likelihood number, at the best maximum found.

The lines of lowest min-loss need not lie near the likelihood's highest maximum: a line through
the rows two components share fits them well but explains neither, and EM from such lines stops
at a lower maximum than EM from a random partition of the rows (flexmix's start; its
``stepFlexmix`` keeps the best of ``nrep = 10``). Every likelihood the estimator reports
(``log_likelihood_``, the standard errors, ``summary()``, the bootstrap's centre) and every
score of a k sweep therefore comes from :func:`best_maximum_likelihood`:

- EM from the min-loss lines (weights and variances from the partition they induce);
- EM from the caller's further starts (a k sweep: the (k - 1)-line maximum-likelihood fit plus
  one line);
- EM from :data:`ML_RESTARTS` random partitions of the rows.

All the starts run EM together on a sample of at most :data:`ML_SAMPLE_ROWS` rows (all rows
when there are fewer); the starts that end above the min-loss lines there (the best
:data:`ML_FINALISTS` of them) are polished on all rows beside the lines, and the highest
likelihood wins. On a sample the lines go on to all rows twice, from themselves and from their
maximum on the sample: EM over all rows may climb from the lines to a lower maximum than the one
the sample found (restarts that reach the sample's maximum only tie with the lines there, and
would not be polished). A maximum at which a line owns fewer rows than its coefficients plus
:data:`MIN_RESIDUAL_ROWS` (weight times rows), or whose noise variance sits on EM's tiny
default floor, is a spurious maximum (the likelihood spikes as a line closes in on a few rows;
a variance resting on a larger floor the caller sets is not spurious) and is not kept, as
flexmix drops a line whose prior falls below its minimum; the maximum EM reaches from the
min-loss lines is kept when no start reaches a proper one. The fit is therefore never below EM
from the min-loss lines, unless that maximum is spurious.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._em import EMBatchResult, default_variance_floor, em, em_batch, initial_parameters
from ._inference import (
    POLISH_MAX_ITER,
    POLISH_TOL,
    LikelihoodPass,
    MixtureParameters,
    log_likelihood,
    match_lines,
    maximum_likelihood_polish,
)
from ._loss import Grouping
from ._lstsq import lstsq_by_labels

FloatArray = NDArray[np.float64]

ML_RESTARTS = 10
"""EM restarts from random partitions of the rows, as flexmix's ``stepFlexmix(nrep = 10)``."""
ML_SAMPLE_ROWS = 20_000
"""Rows the starts run EM on together (a uniform sample above this many rows)."""
ML_START_MAX_ITER, ML_START_TOL = 200, 1e-7
"""EM of the starts on the sample: iterations at most, and the change of the mean
log-likelihood per row at which a start stops."""
ML_FINALISTS = 2
"""Starts besides the min-loss lines polished on all rows at most."""
ML_BETTER_BY = 1e-6
"""Mean log-likelihood per row (on the sample) by which a start must beat the min-loss lines'
EM to be polished on all rows."""
# Fits whose floor Newton's method would not respect are polished by EM alone, to this change
# of the mean log-likelihood per row or this many iterations over all rows.
_EM_ONLY_TOL, _EM_ONLY_MAX_ITER = 1e-9, 100
# Grouped mixtures are polished by grouped EM alone (no Newton finish): to this change of the
# mean log-likelihood per row, or this many iterations.
_GROUPED_TOL, _GROUPED_MAX_ITER = 1e-9, 100
# A noise variance within this factor of a floor at most _NEAR_DEFAULT_FLOOR times EM's default
# has collapsed onto it.
_ON_THE_FLOOR, _NEAR_DEFAULT_FLOOR = 1.5, 100.0

MIN_RESIDUAL_ROWS = 3
"""Rows a line of a proper maximum owns beyond its coefficients: a line through one or two rows
more than it has coefficients fits them almost exactly, and its likelihood spikes there."""
LINES_START = "min-loss lines"
RESTART_START = "em restart"
SPLIT_START = "split of k - 1"
# A split line's two halves start this many noise standard deviations apart, over two.
_SPLIT_SHIFT = 0.1


@dataclass(frozen=True)
class MaximumLikelihoodFit:
    """The maximum-likelihood mixture :func:`best_maximum_likelihood` kept.

    Attributes
    ----------
    params : MixtureParameters
        Its lines matched, line by line, to the min-loss lines it was given.
    log_likelihood : float
        Total (weighted) log-likelihood of the rows, in the units of the ``y`` given.
    start : str
        Where the kept fit started: :data:`LINES_START`, :data:`RESTART_START` or the name of
        one of the caller's starts.
    lines_log_likelihood : float
        The maximum EM reaches from the min-loss lines (never above ``log_likelihood``).
    n_iter : int
    converged : bool
    at_maximum : LikelihoodPass or None
        The log-likelihood, score and information at ``params`` when Newton's method finished
        the fit (no further pass needed for standard errors); None otherwise.
    """

    params: MixtureParameters
    log_likelihood: float
    start: str
    lines_log_likelihood: float
    n_iter: int
    converged: bool
    at_maximum: LikelihoodPass | None


def random_partition_starts(
    Z: FloatArray,
    y: FloatArray,
    n_components: int,
    count: int,
    rng: np.random.Generator,
    *,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> FloatArray:
    """Least-squares lines of ``count`` random partitions of the rows (of the groups, with
    ``grouping``): flexmix's start.

    Returns
    -------
    ndarray of shape (count, n_components, n_params)
    """
    units = Z.shape[0] if grouping is None else grouping.n_groups
    labels = rng.integers(0, n_components, size=(count, units)).astype(np.intp)
    if grouping is not None:
        labels = labels[:, grouping.codes]
    theta, _ = lstsq_by_labels(Z, y, labels, n_components, sample_weight=sample_weight)
    return theta


def split_starts(previous: MixtureParameters) -> list[tuple[str, MixtureParameters]]:
    """Mixtures of k lines made from a (k - 1)-line maximum by splitting one of its lines.

    Line j becomes two lines of half its weight, its noise variance, and predictions moved by
    +/- a tenth of its noise standard deviation (along the last column: the intercept's when
    there is one). The split mixture's likelihood equals the (k - 1)-line maximum's to second
    order (the moves are symmetric), so EM from it ends at least about as high, and higher when
    a k-th line helps. One start per line.

    Returns
    -------
    list of (name, MixtureParameters)
    """
    splits: list[tuple[str, MixtureParameters]] = []
    for line in range(previous.n_components):
        shift = np.zeros(previous.theta.shape[1])
        shift[-1] = _SPLIT_SHIFT * float(np.sqrt(previous.variances[line]))
        theta = np.vstack([previous.theta, previous.theta[line] + shift])
        theta[line] -= shift
        weights = np.append(previous.weights, previous.weights[line] / 2)
        weights[line] /= 2
        variances = np.append(previous.variances, previous.variances[line])
        splits.append(
            (SPLIT_START, MixtureParameters(theta=theta, weights=weights, variances=variances))
        )
    return splits


def spurious(
    weights: FloatArray,
    variances: FloatArray,
    *,
    n_observations: float,
    n_params: int,
    collapsed_below: float,
) -> bool:
    """Whether a mixture is a spurious maximum: a line owns fewer than ``n_params`` plus
    :data:`MIN_RESIDUAL_ROWS` rows (its weight times the rows), or its noise variance has
    collapsed to ``collapsed_below`` or less."""
    too_few = bool(np.any(weights * n_observations < n_params + MIN_RESIDUAL_ROWS))
    return too_few or bool(np.any(variances <= collapsed_below))


def best_maximum_likelihood(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    rng: np.random.Generator,
    starts: Sequence[tuple[str, MixtureParameters]] = (),
    n_restarts: int = ML_RESTARTS,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
    variance_floor: float | None = None,
) -> MaximumLikelihoodFit:
    """The highest maximum of the mixture likelihood that EM reaches from the min-loss lines,
    the given starts and random partitions of the rows (see the module's docstring).

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
        The (scaled) design, intercept column included.
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
        The min-loss lines; the kept fit's lines are matched to them.
    rng : numpy.random.Generator
        Draws the sample and the random partitions.
    starts : sequence of (name, MixtureParameters)
        Further starts (scaled units), each a whole mixture of ``n_components`` lines.
    n_restarts : int, default=ML_RESTARTS
    sample_weight : ndarray of shape (n_samples,), optional
        Positive replication weights.
    grouping : Grouping, optional
        The grouped mixture (every group's rows from one line): polished by grouped EM.
    variance_floor : float, optional
        Smallest noise variance of a line (EM's default, a tiny fraction of ``var(y)``, when
        None).

    Returns
    -------
    MaximumLikelihoodFit
    """
    n_samples, n_params = Z.shape
    default_floor = default_variance_floor(y, sample_weight)
    floor = default_floor if variance_floor is None else variance_floor
    # Near EM's default floor (a tiny fraction of var(y)) a variance on it has collapsed onto a
    # few rows (the likelihood would grow without bound); a caller's floor far above it bounds
    # the likelihood itself, and proper lines of little noise may rest on it.
    near_default = floor <= _NEAR_DEFAULT_FLOOR * default_floor
    collapsed_below = _ON_THE_FLOOR * floor if near_default else 0.0
    n_observations = float(n_samples if sample_weight is None else np.sum(sample_weight))
    sampled = grouping is None and n_samples > ML_SAMPLE_ROWS
    rows = np.sort(rng.choice(n_samples, size=ML_SAMPLE_ROWS, replace=False)) if sampled else None
    names, batch, sample_observations = _starts_on_sample(
        Z, y, theta, starts, rows, n_restarts, rng, sample_weight, grouping, floor
    )
    chosen = _finalists(batch, sample_observations, n_params, collapsed_below)

    def admissible(fit: MaximumLikelihoodFit) -> bool:
        return not spurious(
            fit.params.weights,
            fit.params.variances,
            n_observations=n_observations,
            n_params=n_params,
            collapsed_below=collapsed_below,
        )

    def polish(
        lines: FloatArray, weights: FloatArray | None, variances: FloatArray | None
    ) -> MaximumLikelihoodFit:
        # Newton's method knows no floor: it finishes only the fits whose floor is EM's tiny
        # default, so that every maximum compared here respects the same floor.
        return _polish(
            Z,
            y,
            lines,
            weights,
            variances,
            sample_weight,
            grouping,
            floor,
            n_observations,
            near_default,
        )

    lines = polish(theta, None, None)
    if rows is not None:
        # EM from the lines on all rows may climb to another maximum than on the sample; the
        # sample's maximum goes on to all rows too, and the higher is the lines' (restarts that
        # merely tie with it on the sample are not polished).
        from_sample = polish(batch.thetas[0], batch.weights[0], batch.variances[0])
        if admissible(from_sample) and (
            not admissible(lines) or from_sample.log_likelihood > lines.log_likelihood
        ):
            lines = from_sample

    # A spurious maximum reached from the lines is kept only when no start reaches a proper one.
    best, best_name, best_proper = lines, LINES_START, admissible(lines)
    for index in chosen:
        # The start's lines in the order of the min-loss lines, so the kept fit pairs with them.
        order = match_lines(theta, batch.thetas[index])
        candidate = polish(
            batch.thetas[index][order], batch.weights[index][order], batch.variances[index][order]
        )
        if admissible(candidate) and (
            not best_proper or candidate.log_likelihood > best.log_likelihood
        ):
            best, best_name, best_proper = candidate, names[index], True
    return MaximumLikelihoodFit(
        params=best.params,
        log_likelihood=best.log_likelihood,
        start=best_name,
        lines_log_likelihood=lines.log_likelihood,
        n_iter=best.n_iter,
        converged=best.converged,
        at_maximum=best.at_maximum,
    )


def _starts_on_sample(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    starts: Sequence[tuple[str, MixtureParameters]],
    rows: NDArray[np.intp] | None,
    n_restarts: int,
    rng: np.random.Generator,
    sample_weight: FloatArray | None,
    grouping: Grouping | None,
    floor: float,
) -> tuple[list[str], EMBatchResult, float]:
    """EM from the min-loss lines, the caller's starts and ``n_restarts`` random partitions, all
    at once on ``rows`` (all rows when None): each start's name, EM's batch and the sample's
    observations (its weight)."""
    Z_s = Z if rows is None else Z[rows]
    y_s = y if rows is None else y[rows]
    w_s = sample_weight if sample_weight is None or rows is None else sample_weight[rows]
    n_components = theta.shape[0]
    names = [LINES_START, *(name for name, _ in starts)]
    all_starts = [theta, *(start.theta for _, start in starts)]
    if n_components > 1 and n_restarts > 0:
        restarts = random_partition_starts(
            Z_s, y_s, n_components, n_restarts, rng, sample_weight=w_s, grouping=grouping
        )
        names += [RESTART_START] * n_restarts
        all_starts += list(restarts)
    thetas = np.stack(all_starts)
    # Lines alone start from the partition they induce; the given mixtures from themselves.
    start_weights, start_variances = initial_parameters(
        Z_s, y_s, thetas, floor, sample_weight=w_s, grouping=grouping
    )
    for position, (_, start) in enumerate(starts, start=1):
        start_weights[position], start_variances[position] = start.weights, start.variances
    batch = em_batch(
        Z_s,
        y_s,
        thetas,
        max_iter=ML_START_MAX_ITER,
        tol=ML_START_TOL,
        variance_floor=floor,
        sample_weight=w_s,
        grouping=grouping,
        start_weights=start_weights,
        start_variances=start_variances,
    )
    return names, batch, float(Z_s.shape[0] if w_s is None else np.sum(w_s))


def _finalists(
    batch: EMBatchResult, sample_observations: float, n_params: int, collapsed_below: float
) -> list[int]:
    """The starts (indices into ``batch``, the lines' at 0) that go on to all rows: at most
    :data:`ML_FINALISTS`, the highest on the sample, proper, distinct, and above the lines'
    maximum there by :data:`ML_BETTER_BY` (any proper maximum, when the lines' is spurious)."""
    reached = np.array([history[-1] for history in batch.log_likelihood_histories])

    def spurious_on_sample(index: int) -> bool:
        return spurious(
            batch.weights[index],
            batch.variances[index],
            n_observations=sample_observations,
            n_params=n_params,
            collapsed_below=collapsed_below,
        )

    to_beat = -np.inf if spurious_on_sample(0) else reached[0] + ML_BETTER_BY
    chosen: list[int] = []
    for index in np.argsort(-reached[1:], kind="stable") + 1:
        if len(chosen) == ML_FINALISTS or reached[index] <= to_beat:
            break
        if spurious_on_sample(int(index)):
            continue
        if any(np.allclose(batch.thetas[index], batch.thetas[other]) for other in chosen):
            continue
        chosen.append(int(index))
    return chosen


def _polish(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    weights: FloatArray | None,
    variances: FloatArray | None,
    sample_weight: FloatArray | None,
    grouping: Grouping | None,
    floor: float,
    n_observations: float,
    newton: bool,
) -> MaximumLikelihoodFit:
    """One start polished on all rows to its maximum, with its total log-likelihood."""
    if grouping is None:
        # EM alone (a floor Newton's method would not respect) stops as a k sweep's score
        # always has: it runs over every row, and its last iterations creep.
        polish = maximum_likelihood_polish(
            Z,
            y,
            theta,
            newton_finish=newton,
            max_iter=POLISH_MAX_ITER if newton else _EM_ONLY_MAX_ITER,
            tol=POLISH_TOL if newton else _EM_ONLY_TOL,
            sample_weight=sample_weight,
            weights=weights,
            variances=variances,
            variance_floor=floor,
        )
        total = (
            log_likelihood(Z, y, polish.params, sample_weight)
            if polish.at_maximum is None
            else polish.at_maximum.log_likelihood
        )
        return MaximumLikelihoodFit(
            params=polish.params,
            log_likelihood=total,
            start="",
            lines_log_likelihood=total,
            n_iter=polish.n_iter,
            converged=polish.converged,
            at_maximum=polish.at_maximum,
        )
    result = em(
        Z,
        y,
        theta,
        max_iter=_GROUPED_MAX_ITER,
        tol=_GROUPED_TOL,
        sample_weight=sample_weight,
        grouping=grouping,
        variance_floor=floor,
        start_weights=weights,
        start_variances=variances,
    )
    assert result.weights is not None and result.variances is not None
    assert result.log_likelihood_history
    # EM's history holds the mean log-likelihood per unit of weight.
    total = n_observations * result.log_likelihood_history[-1]
    return MaximumLikelihoodFit(
        params=MixtureParameters(
            theta=result.theta, weights=result.weights, variances=result.variances
        ),
        log_likelihood=total,
        start="",
        lines_log_likelihood=total,
        n_iter=result.n_iter,
        converged=result.converged,
        at_maximum=None,
    )
