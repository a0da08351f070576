"""Moves of the default search: new starting line sets made from a good one.

A local minimum of classical AM with many lines is usually wrong in a few places only: two
lines share what one line could fit, while somewhere else one line straddles what two lines
should fit, or no line reaches a group of rows at all. Each move here keeps most of a good line
set and changes it where its min-loss says it is wrong; classical AM then polishes the result.

- :func:`split_and_free` splits a line that fits its rows badly into two (the least-squares
  lines of its rows above and below it) and frees a slot for the extra line by dropping the
  line whose rows lose least by going to their second-best line, or by merging the two lines
  whose union costs least to fit with one line.
- :func:`reseed_by_residual` replaces a line with the least-squares line of a few rows drawn
  with probability proportional to their squared residual (as k-means++ seeds its centres).

Every move is computed from the normal equations of the parts of one partition of the rows,
a few matrix products over all rows, whatever the number of candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._loss import Grouping
from ._lstsq import normal_equations_by_label
from ._normal_equations import solve_normal_equations

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]


@dataclass(frozen=True)
class Fit:
    """How a line set fits the rows: best and second-best squared residuals, per-line sums.

    With sample weights every sum is weighted; with groups, the units lines own are groups
    (a group's loss under a line is the weighted sum over its rows) and every row takes its
    group's line.
    """

    theta: FloatArray
    """Shape (n_components, n_params)."""
    residuals: FloatArray
    """Shape (n_components, n_samples): ``y - Z theta_j``."""
    labels: IntArray
    """Shape (n_samples,): each row's line (ties to the lowest index)."""
    best: FloatArray
    """Shape (n_samples,): each row's squared residual under its line."""
    unit_labels: IntArray
    """Shape (n_units,): each unit's (row's or group's) best line."""
    unit_best: FloatArray
    """Shape (n_units,): each unit's smallest (weighted) loss."""
    unit_second: FloatArray
    """Shape (n_units,): each unit's second-smallest (weighted) loss."""

    @classmethod
    def of(
        cls,
        Z: FloatArray,
        y: FloatArray,
        theta: FloatArray,
        sample_weight: FloatArray | None = None,
        grouping: Grouping | None = None,
    ) -> Fit:
        residuals = y - theta @ Z.T
        squared = residuals * residuals
        losses = squared if sample_weight is None else squared * sample_weight
        if grouping is not None:
            losses = grouping.sum(losses)
        order = np.argsort(losses, axis=0, kind="stable")[:2]
        units = np.arange(losses.shape[1])
        unit_best = losses[order[0], units]
        unit_second = losses[order[1], units] if theta.shape[0] > 1 else losses[0]
        labels = order[0] if grouping is None else order[0][grouping.codes]
        return cls(
            theta=theta,
            residuals=residuals,
            labels=labels,
            best=squared[labels, np.arange(Z.shape[0])],
            unit_labels=order[0],
            unit_best=unit_best,
            unit_second=unit_second,
        )

    @property
    def n_components(self) -> int:
        return int(self.theta.shape[0])

    def line_losses(self) -> FloatArray:
        """Each line's (weighted) sum of squared residuals over the rows it owns."""
        return np.bincount(
            self.unit_labels, weights=self.unit_best, minlength=self.n_components
        ).astype(np.float64)

    def drop_costs(self) -> FloatArray:
        """What each line's removal adds to the summed squared residuals (its rows, or
        groups, go to their second-best line)."""
        costs = np.bincount(
            self.unit_labels, weights=self.unit_second - self.unit_best, minlength=self.n_components
        )
        return costs.astype(np.float64)


def _part_least_squares(
    Z: FloatArray,
    y: FloatArray,
    labels: IntArray,
    n_parts: int,
    sample_weight: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Each part's (weighted) least-squares line and the sum of its squared residuals.

    Returns
    -------
    lines : ndarray of shape (n_parts, n_params)
    losses : ndarray of shape (n_parts,)
    """
    gram, rhs, _ = normal_equations_by_label(
        Z, y, labels[None, :], n_parts, sample_weight=sample_weight
    )
    lines = solve_normal_equations(gram[0], rhs[0])
    totals = np.bincount(labels, weights=_weighted_squares(y, sample_weight), minlength=n_parts)
    # ||y_P - Z_P theta||^2 = y_P.y_P - theta.Z_P^T y_P at the least-squares theta.
    losses = np.maximum(totals - np.einsum("kp,kp->k", lines, rhs[0]), 0.0)
    return lines, losses


def _weighted_squares(y: FloatArray, sample_weight: FloatArray | None) -> FloatArray:
    squares: FloatArray = y * y if sample_weight is None else sample_weight * y * y
    return squares


def _merge_costs(
    Z: FloatArray,
    y: FloatArray,
    fit: Fit,
    line_losses: FloatArray,
    sample_weight: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, IntArray]:
    """For every pair of lines, the least-squares line of their rows and the cost of merging.

    Returns
    -------
    merged : ndarray of shape (n_pairs, n_params)
    costs : ndarray of shape (n_pairs,)
        The merged line's squared residuals over both lines' rows, minus both lines' own.
    pairs : ndarray of shape (n_pairs, 2)
    """
    k = fit.n_components
    gram, rhs, _ = normal_equations_by_label(
        Z, y, fit.labels[None, :], k, sample_weight=sample_weight
    )
    first, second = np.triu_indices(k, 1)
    pair_gram = gram[0, first] + gram[0, second]
    pair_rhs = rhs[0, first] + rhs[0, second]
    merged = solve_normal_equations(pair_gram, pair_rhs)
    totals = np.bincount(fit.labels, weights=_weighted_squares(y, sample_weight), minlength=k)
    union_losses = totals[first] + totals[second] - np.einsum("kp,kp->k", merged, pair_rhs)
    costs = np.maximum(union_losses, 0.0) - line_losses[first] - line_losses[second]
    return merged, costs, np.column_stack([first, second])


def split_and_free(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    count: int,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> FloatArray:
    """Line sets with one line split in two and one slot freed, most promising first.

    The line ``s`` is split into the least-squares lines of its rows above it and of its rows
    below it (the best two-line fit of its rows when they straddle two lines). The slot for
    the extra line comes from dropping a line ``d != s`` (its rows go to their second-best
    line) or from merging two lines ``a, b`` (neither ``s``) into the least-squares line of
    their rows. Every combination is ranked by its estimated change of the summed squared
    residuals (the split's gain against the slot's cost, each computed with the other lines
    fixed), and the ``count`` best are returned.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
        At least two lines.
    count : int
    sample_weight : ndarray of shape (n_samples,), optional
        Row weights of every sum.
    grouping : Grouping, optional
        Lines own whole groups: a group goes to the half its rows lie on (the sign of its
        weighted residual sum), is dropped to its second-best line as a whole.

    Returns
    -------
    ndarray of shape (at most count, n_components, n_params)
    """
    fit = Fit.of(Z, y, theta, sample_weight, grouping)
    k = fit.n_components
    line_losses = fit.line_losses()
    own_residuals = fit.residuals[fit.labels, np.arange(Z.shape[0])]
    if grouping is None:
        below = own_residuals < 0
    else:
        weighted = own_residuals if sample_weight is None else own_residuals * sample_weight
        below = (grouping.sum(weighted) < 0)[grouping.codes]
    halves, half_losses = _part_least_squares(Z, y, 2 * fit.labels + below, 2 * k, sample_weight)
    split_gains = line_losses - half_losses.reshape(k, 2).sum(axis=1)
    drop_costs = fit.drop_costs()
    merged, merge_costs, pairs = _merge_costs(Z, y, fit, line_losses, sample_weight)

    # Every way to free a slot for the extra line, with the line that is split:
    # drop d (s != d), or merge the pair (a, b) into a's slot and free b's (s outside it).
    split, dropped = (a.ravel() for a in np.meshgrid(np.arange(k), np.arange(k), indexing="ij"))
    keep = split != dropped
    split, dropped = split[keep], dropped[keep]
    merge_split, merge_pair = (
        a.ravel() for a in np.meshgrid(np.arange(k), np.arange(len(pairs)), indexing="ij")
    )
    keep = (merge_split != pairs[merge_pair, 0]) & (merge_split != pairs[merge_pair, 1])
    merge_split, merge_pair = merge_split[keep], merge_pair[keep]

    split_line = np.concatenate([split, merge_split])
    freed = np.concatenate([dropped, pairs[merge_pair, 1]])
    merge_into = np.concatenate([np.full(split.size, -1), pairs[merge_pair, 0]])
    merge_index = np.concatenate([np.zeros(split.size, dtype=np.intp), merge_pair])
    change = (
        np.concatenate([drop_costs[dropped], merge_costs[merge_pair]]) - split_gains[split_line]
    )

    chosen = np.argsort(change, kind="stable")[:count]
    split_line, freed = split_line[chosen], freed[chosen]
    merge_into, merge_index = merge_into[chosen], merge_index[chosen]
    starts = np.repeat(theta[None], chosen.size, axis=0)
    rows = np.arange(chosen.size)
    merging = merge_into >= 0
    starts[rows[merging], merge_into[merging]] = merged[merge_index[merging]]
    # The split line's slot takes the upper half of its rows' fit, the freed slot the lower.
    starts[rows, split_line] = halves[2 * split_line]
    starts[rows, freed] = halves[2 * split_line + 1]
    return starts


def reseed_by_residual(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    count: int,
    rng: np.random.Generator,
    sample_weight: FloatArray | None = None,
    grouping: Grouping | None = None,
) -> FloatArray:
    """Line sets with one line replaced by a line where the others fit worst.

    With sample weights a row is drawn with probability proportional to its weight times its
    squared residual; with groups, residuals are those under each row's group's line and the
    line replaced is ranked by what dropping it costs its groups.

    Each new line is the least-squares line of ``2 * n_params`` rows drawn without
    replacement with probability proportional to their smallest squared residual, as
    k-means++ draws its centres: rows no line reaches are likely picked together. The line
    replaced is the one whose removal costs least for the first start, then drawn with
    probability decreasing in that cost.

    Parameters
    ----------
    Z : ndarray of shape (n_samples, n_params)
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (n_components, n_params)
    count : int
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of shape (count, n_components, n_params)
    """
    fit = Fit.of(Z, y, theta, sample_weight, grouping)
    n_samples, n_params = Z.shape
    k = fit.n_components
    size = min(2 * n_params, n_samples)
    weights = fit.best if sample_weight is None else fit.best * sample_weight
    weights = weights + np.finfo(np.float64).tiny
    # Gumbel-top-k: the ``size`` largest of log w + Gumbel noise are a weighted draw without
    # replacement, for every start in one array operation.
    keys = np.log(weights) + rng.gumbel(size=(count, n_samples))
    picked = np.argpartition(-keys, size - 1, axis=1)[:, :size]
    rows_Z, rows_y = Z[picked], y[picked]
    new_lines = solve_normal_equations(
        np.einsum("csp,csq->cpq", rows_Z, rows_Z), np.einsum("csp,cs->cp", rows_Z, rows_y)
    )
    costs = fit.drop_costs()
    order = np.argsort(costs, kind="stable")
    # Cheapest line first, then lines drawn with weights 1/2, 1/3, ... by rank of cost.
    rank_weights = 1.0 / np.arange(1, k + 1)
    replaced = order[rng.choice(k, size=count, p=rank_weights / rank_weights.sum())]
    replaced[0] = order[0]
    starts = np.repeat(theta[None], count, axis=0)
    starts[np.arange(count), replaced] = new_lines
    return starts
