"""The least-squares moments of one partition of the rows, kept as the partition changes.

Classical AM refits every part after every reassignment, and after its first iterations few
rows change parts: :class:`PartitionSums` (few parameters, many partitions at once) and
:class:`WidePartitionMoments` (many parameters, one partition) add the rows that moved to
their new part and subtract them from their old one instead of summing every part again.
:func:`refit_exactly` gives each part's final line to working precision (centred, then one
refinement from the residuals).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._lstsq import (
    _augmented,
    _block_rows,
    _memberships,
    _Moments,
    _summed_products,
    _unpack_sums,
    cross_products,
    has_intercept_column,
)
from ._normal_equations import solve_normal_equations

FloatArray = NDArray[np.float64]


# Rows that changed parts, as a share of all (partition, row) pairs, up to which the running
# sums of :class:`PartitionSums` are updated row by row; above it, summed again in one product.
_MOVED_SHARE_MAX = 0.05


@dataclass
class PartitionSums:
    """The normal equations of every part of many partitions, kept up to date as rows move.

    Classical AM refits every part after every reassignment, but after its first iterations
    few rows change parts: adding the products of the rows that moved to their new part and
    subtracting them from their old one costs a pass over those rows only, where summing
    again costs a product over all rows.

    Sums are uncentred (see :func:`_weighted_sums`): for few parameters and standardized data.
    """

    Z: FloatArray
    y: FloatArray
    products: FloatArray
    """:attr:`WeightedLeastSquares.products` of ``Z`` and ``y``."""
    n_components: int
    sample_weight: FloatArray | None
    labels: NDArray[np.intp]
    """Shape (n_partitions, n_samples): the partitions the sums are of."""
    sums: FloatArray
    """Shape (n_partitions, n_components, n_columns): summed (weighted) row products."""
    counts: NDArray[np.intp]
    """Shape (n_partitions, n_components): rows of each part."""

    @classmethod
    def of(
        cls,
        Z: FloatArray,
        y: FloatArray,
        products: FloatArray,
        labels: NDArray[np.intp],
        n_components: int,
        sample_weight: FloatArray | None = None,
    ) -> PartitionSums:
        """The sums of the partitions ``labels`` (n_partitions, n_samples) of the rows ``Z``,
        ``y`` (whose :attr:`WeightedLeastSquares.products` are ``products``), from scratch."""
        n_partitions = labels.shape[0]
        n_parts = n_partitions * n_components
        membership = _memberships(labels, n_components, sample_weight)
        sums = _summed_products(Z, y, n_parts, membership, products)
        flat = labels + n_components * np.arange(n_partitions)[:, None]
        counts = np.bincount(flat.ravel(), minlength=n_parts)
        return cls(
            Z=Z,
            y=y,
            products=products,
            n_components=n_components,
            sample_weight=sample_weight,
            labels=labels,
            sums=sums.reshape(n_partitions, n_components, -1),
            counts=counts.reshape(n_partitions, n_components),
        )

    def moved_to(
        self, labels: NDArray[np.intp], kept: NDArray[np.bool_], moved: NDArray[np.bool_]
    ) -> PartitionSums:
        """The sums of new partitions of the ``kept`` partitions' rows.

        Parameters
        ----------
        labels : ndarray of shape (kept.sum(), n_samples)
            The new partition of every kept one, in order.
        kept : ndarray of shape (n_partitions,)
        moved : ndarray of shape (kept.sum(), n_samples)
            Where ``labels`` differs from the kept partitions (the caller has it at hand).
        """
        n_partitions, n_samples = labels.shape
        moved_at = np.flatnonzero(moved)
        if moved_at.size > _MOVED_SHARE_MAX * moved.size:
            return PartitionSums.of(
                self.Z, self.y, self.products, labels, self.n_components, self.sample_weight
            )
        previous = self.labels if kept.all() else self.labels[kept]
        partitions, rows = np.divmod(moved_at, n_samples)
        k, n_columns = self.n_components, self.products.shape[1]
        n_parts = n_partitions * k
        into = partitions * k + labels.ravel()[moved_at]
        out_of = partitions * k + previous.ravel()[moved_at]
        values = self.products[rows]
        if self.sample_weight is not None:
            values = values * self.sample_weight[rows, None]
        # One bincount per direction over (part, column) pairs: every moved row's products
        # added to its new part and subtracted from its old one, in the rows' order.
        columns = np.arange(n_columns)
        flat_values = values.ravel()
        added = np.bincount(
            (into[:, None] * n_columns + columns).ravel(),
            weights=flat_values,
            minlength=n_parts * n_columns,
        )
        removed = np.bincount(
            (out_of[:, None] * n_columns + columns).ravel(),
            weights=flat_values,
            minlength=n_parts * n_columns,
        )
        sums = self.sums[kept] + (added - removed).reshape(n_partitions, k, n_columns)
        counts = self.counts[kept] + (
            np.bincount(into, minlength=n_parts) - np.bincount(out_of, minlength=n_parts)
        ).reshape(n_partitions, k)
        # An emptied part holds rounding residue only: it restarts from zero.
        sums[counts == 0] = 0.0
        return PartitionSums(
            Z=self.Z,
            y=self.y,
            products=self.products,
            n_components=k,
            sample_weight=self.sample_weight,
            labels=labels,
            sums=sums,
            counts=counts,
        )

    def solve(self) -> FloatArray:
        """Least-squares line of every non-empty part (zeros for an empty one).

        Returns
        -------
        ndarray of shape (n_partitions, n_components, n_params)
        """
        n_partitions, k, _ = self.sums.shape
        n_params = self.Z.shape[1]
        theta = np.zeros((n_partitions, k, n_params))
        filled = self.counts > 0
        if filled.any():
            gram, rhs = _unpack_sums(self.sums[filled], n_params)
            theta[filled] = solve_normal_equations(gram, rhs)
        return theta


def refit_exactly(
    Z: FloatArray,
    y: FloatArray,
    labels: NDArray[np.intp],
    n_components: int,
    *,
    sample_weight: FloatArray | None = None,
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Each part's least-squares line to working precision: centred, then one refinement.

    The centred normal equations of each part are solved, then corrected once from the
    residuals of that solution (the corrected semi-normal equations: one more pass over the
    rows, of ``O(n_samples x n_params)``), which recovers most of what the normal equations'
    squared condition number loses: the result agrees with ``LinearRegression`` on the part's
    rows to about ``eps * cond``.

    Parameters and return value as :func:`lstsq_by_label`, with ``sample_weight`` as in
    :func:`lstsq_by_labels` (weighted moments and a weighted correction).
    """
    centre = has_intercept_column(Z)
    n_samples, n_params = Z.shape
    n_x = n_params - centre
    rows_per_block = _block_rows(n_params)
    moments = _Moments.zeros(n_components, n_x + 1)
    for start in range(0, n_samples, rows_per_block):
        block = slice(start, start + rows_per_block)
        augmented = _augmented(Z[block], y[block], centre)
        if sample_weight is None:
            for component, rows in _rows_by_label(augmented, labels[block], n_components):
                moments.add(component, rows, centre)
            continue
        # The weights ride along as a last column, gathered with their rows.
        weighted = np.column_stack([augmented, sample_weight[block]])
        for component, rows in _rows_by_label(weighted, labels[block], n_components):
            moments.add(component, rows[:, :-1], centre, rows[:, -1])
    if sample_weight is None:
        counts = np.rint(moments.weight).astype(np.intp)
    else:
        counts = np.bincount(labels, minlength=n_components).astype(np.intp)
    used = moments.weight > 0
    theta = np.zeros((n_components, n_params))
    if not used.any():
        return theta, counts
    theta[used] = moments.subset(used).solve(centre)
    # The correction solves the same normal equations for the residuals: only their
    # cross-products with the centred features are new.
    cross = np.zeros((n_components, n_x))
    residual_sum = np.zeros(n_components)
    for start in range(0, n_samples, rows_per_block):
        block = slice(start, start + rows_per_block)
        residual = y[block] - np.einsum("ij,ij->i", Z[block], theta[labels[block]])
        if sample_weight is not None:
            # Weighted cross-products: the residual times its weight, the features as they are.
            residual *= sample_weight[block]
        augmented = _augmented(Z[block], residual, centre)
        for component, rows in _rows_by_label(augmented, labels[block], n_components):
            centred = rows[:, :n_x] - moments.mean[component, :n_x]
            cross[component] += centred.T @ rows[:, n_x]
            residual_sum[component] += rows[:, n_x].sum()
    scatter = moments.scatter[used][:, :n_x, :n_x]
    correction = solve_normal_equations(scatter, cross[used])
    theta[used, :n_x] += correction
    if centre:
        residual_mean = residual_sum[used] / moments.weight[used]
        theta[used, n_x] += residual_mean - np.einsum(
            "px,px->p", moments.mean[used, :n_x], correction
        )
    return theta, counts


def _rows_by_label(
    rows: FloatArray, labels: NDArray[np.intp], n_components: int
) -> list[tuple[int, FloatArray]]:
    """The rows of each non-empty part of a block, gathered part after part."""
    order = np.argsort(labels, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=n_components))])
    gathered = rows[order]
    return [
        (component, gathered[bounds[component] : bounds[component + 1]])
        for component in range(n_components)
        if bounds[component + 1] > bounds[component]
    ]


# Above this share of moved rows, summing every part again is cheaper than adding the moved
# rows to their new parts and subtracting them from their old ones (twice the rows).
_WIDE_MOVED_SHARE_MAX = 0.4


def shared_origin(Z: FloatArray, y: FloatArray, sample_weight: FloatArray | None) -> FloatArray:
    """The (weighted) mean of all rows' ``[features, y]`` (zeros without an intercept column).

    Sums of products about it stay exact to rounding whatever the data's offset: the origin
    every partition's moments of :class:`WidePartitionMoments` share.

    Returns
    -------
    ndarray of shape (n_x + 1,)
        ``n_x`` is the number of features without the intercept column.
    """
    centre = has_intercept_column(Z)
    n_x = Z.shape[1] - centre
    origin = np.zeros(n_x + 1)
    if centre:
        if sample_weight is None:
            origin[:n_x] = Z[:, :n_x].mean(axis=0)
            origin[n_x] = y.mean()
        else:
            total = sample_weight.sum()
            origin[:n_x] = (sample_weight @ Z[:, :n_x]) / total
            origin[n_x] = (sample_weight @ y) / total
    return origin


@dataclass
class WidePartitionMoments:
    """Weight, sum and sum of products of ``[features, y]`` about a shared origin, per part of
    one partition of the rows, kept up to date as rows change parts.

    The sums are about the mean of all rows (:func:`shared_origin`), so they are additive:
    rows that move are added to their new part and subtracted from their old one, and each
    part's centred scatter follows as ``sum of products - weight * mean mean^T``. Memory is
    ``k (p + 1)^2`` whatever the rows; time per update is the moved rows' products.
    """

    Z: FloatArray
    y: FloatArray
    sample_weight: FloatArray | None
    origin: FloatArray
    """Shape (n_x + 1,): see :func:`shared_origin`."""
    labels: NDArray[np.intp]
    """Shape (n_samples,): the partition the sums are of."""
    weight: FloatArray
    """Shape (n_components,)."""
    total: FloatArray
    """Shape (n_components, n_x + 1): (weighted) sums of the rows about the origin."""
    products: FloatArray
    """Shape (n_components, n_x + 1, n_x + 1): (weighted) sums of their outer products."""
    counts: NDArray[np.intp]
    """Shape (n_components,): rows of each part."""

    @classmethod
    def of(
        cls,
        Z: FloatArray,
        y: FloatArray,
        labels: NDArray[np.intp],
        n_components: int,
        origin: FloatArray,
        sample_weight: FloatArray | None = None,
    ) -> WidePartitionMoments:
        """The moments of the partition ``labels`` of the rows, summed from scratch."""
        n_columns = origin.size
        moments = cls(
            Z=Z,
            y=y,
            sample_weight=sample_weight,
            origin=origin,
            labels=labels,
            weight=np.zeros(n_components),
            total=np.zeros((n_components, n_columns)),
            products=np.zeros((n_components, n_columns, n_columns)),
            counts=np.bincount(labels, minlength=n_components).astype(np.intp),
        )
        for component in range(n_components):
            moments._accumulate(component, np.flatnonzero(labels == component), None)
        return moments

    def _shifted(self, rows: NDArray[np.intp]) -> FloatArray:
        """``[features, y]`` of the given rows, about the origin."""
        n_x = self.origin.size - 1
        shifted = np.empty((rows.size, n_x + 1))
        np.subtract(self.Z[rows, :n_x], self.origin[:n_x], out=shifted[:, :n_x])
        shifted[:, n_x] = self.y[rows] - self.origin[n_x]
        return shifted

    def _accumulate(self, component: int, rows: NDArray[np.intp], signs: FloatArray | None) -> None:
        """Add the rows (each times its sign, when given) to part ``component``, in blocks."""
        per_block = _block_rows(self.origin.size)
        for start in range(0, rows.size, per_block):
            chosen = rows[start : start + per_block]
            shifted = self._shifted(chosen)
            weights = None if self.sample_weight is None else self.sample_weight[chosen]
            if signs is not None:
                block_signs = signs[start : start + per_block]
                weights = block_signs if weights is None else weights * block_signs
            if weights is None:
                self.weight[component] += chosen.size
                self.total[component] += shifted.sum(axis=0)
                self.products[component] += cross_products(shifted)
            elif signs is None:
                self.weight[component] += weights.sum()
                self.total[component] += weights @ shifted
                self.products[component] += cross_products(shifted * np.sqrt(weights)[:, None])
            else:
                self.weight[component] += weights.sum()
                self.total[component] += weights @ shifted
                self.products[component] += shifted.T @ (shifted * weights[:, None])

    def moved_to(self, labels: NDArray[np.intp], moved: NDArray[np.bool_]) -> WidePartitionMoments:
        """The moments of the new partition ``labels``, which differs where ``moved`` is True
        (updated in place, or summed again when many rows moved)."""
        n_components = self.weight.size
        moved_at = np.flatnonzero(moved)
        if moved_at.size > _WIDE_MOVED_SHARE_MAX * labels.size:
            return WidePartitionMoments.of(
                self.Z, self.y, labels, n_components, self.origin, self.sample_weight
            )
        into, out_of = labels[moved_at], self.labels[moved_at]
        for component in range(n_components):
            entering = moved_at[into == component]
            leaving = moved_at[out_of == component]
            if entering.size or leaving.size:
                signs = np.concatenate([np.ones(entering.size), -np.ones(leaving.size)])
                self._accumulate(component, np.concatenate([entering, leaving]), signs)
        self.counts = np.bincount(labels, minlength=n_components).astype(np.intp)
        # An emptied part holds rounding residue only: it restarts from zero.
        empty = self.counts == 0
        self.weight[empty], self.total[empty], self.products[empty] = 0.0, 0.0, 0.0
        self.labels = labels
        return self

    def solve(self) -> FloatArray:
        """Least-squares line of every non-empty part (zeros for an empty one), centred as
        :class:`_Moments` solves: shape (n_components, n_params)."""
        n_components, n_columns = self.total.shape
        n_x = n_columns - 1
        centre = has_intercept_column(self.Z)
        theta = np.zeros((n_components, self.Z.shape[1]))
        filled = (self.counts > 0) & (self.weight > 0)
        if not filled.any():
            return theta
        weight = self.weight[filled]
        mean = self.total[filled] / weight[:, None]
        scatter = self.products[filled]
        if centre:
            scatter = scatter - weight[:, None, None] * mean[:, :, None] * mean[:, None, :]
        slopes = solve_normal_equations(scatter[:, :n_x, :n_x], scatter[:, :n_x, n_x])
        if centre:
            means = mean + self.origin
            intercept = means[:, n_x] - np.einsum("pi,pi->p", means[:, :n_x], slopes)
            slopes = np.concatenate([slopes, intercept[:, None]], axis=1)
        theta[filled] = slopes
        return theta
