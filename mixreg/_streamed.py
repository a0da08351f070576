"""Fits streamed over row chunks: every step over all rows is a pass of sums over the chunks.

A fit of ``algorithm="auto"`` touches all rows only in sums: the scaling's means, spreads and
extents, the polish of the finalists by classical AM (each part's normal equations), the exact
refits (each part's centred moments, then one correction), the min-loss and the shares. Its
search runs on a sample of :data:`~mixreg._auto.SEARCH_ROWS` rows. So a fit over a
:class:`~mixreg._chunks.ChunkSource` holds one chunk and ``O(k (p + 1)^2)`` sums per start at a
time, plus the search sample:

- four passes give the scaling of :class:`~mixreg._scaling.Scaling` (the same constants
  as on the whole matrix, to rounding), and each chunk is put in its units as it is read;
- the search sample is drawn as the in-memory fit draws it (the row count is known up front,
  so the same indices under the same seed) and gathered in one pass;
- every iteration of the polish is one pass returning, per start, the loss, the rows that
  changed lines and each line's ``[z, y]`` cross-products; the exact refits are three passes
  a round (moments, correction, the new partition's loss).

Every pass is a function of one chunk, its results combined in chunk order, so a source that
runs them as tasks on a cluster (:mod:`mixreg._dask`) gives the same lines bit for bit as one
that reads its chunks in this process. On data that fits in memory the streamed fit gives the
in-memory fit's lines (same seed) to rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ._am import BatchResult, StepCallback, assign_many
from ._chunks import Chunk, ChunkSource
from ._loss import predict_lines, row_min_losses
from ._lstsq import _augmented, _block_rows, _Moments
from ._normal_equations import solve_normal_equations
from ._partition_moments import _rows_by_label

if TYPE_CHECKING:
    from ._estimator import MixtureOfLinearRegressions, ProgressCallback
    from ._scaling import Scaling

FloatArray = NDArray[np.float64]

# Exact refits after the polish: as many rounds as the in-memory fit's.
_EXACT_REFIT_ROUNDS = 5


@dataclass(frozen=True)
class Design:
    """How a chunk's rows become the fit's: which are kept, and the scaling's constants.

    A row of weight zero is a row that is not there (as in the in-memory fit), and equal
    weights fit as no weights (``weighted`` False). The constants are those of
    :class:`~mixreg._scaling.Scaling` in the order it applies them, so a chunk's scaled
    rows equal the rows of the scaled whole matrix bit for bit given equal constants.
    """

    weighted: bool
    fit_intercept: bool
    extent: FloatArray
    feature_mean: FloatArray = field(default_factory=lambda: np.zeros(0))
    spread: FloatArray = field(default_factory=lambda: np.zeros(0))
    row_norm: float = 1.0
    y_mean: float = 0.0
    y_scale: float = 1.0

    def kept(self, chunk: Chunk) -> tuple[FloatArray, FloatArray, FloatArray | None]:
        """The chunk's rows of positive weight, with their weights when the fit is weighted."""
        weights = chunk.sample_weight
        if weights is None:
            return chunk.X, chunk.y, None
        positive = weights > 0
        if positive.all():
            return chunk.X, chunk.y, weights if self.weighted else None
        return chunk.X[positive], chunk.y[positive], weights[positive] if self.weighted else None

    def features(self, X: FloatArray) -> FloatArray:
        """Features divided by their extents and, once known, centred (with an intercept)."""
        features = X / self.extent
        if self.fit_intercept and self.feature_mean.size:
            features -= self.feature_mean
        return features

    def scaled(self, chunk: Chunk) -> tuple[FloatArray, FloatArray, FloatArray | None]:
        """The chunk's kept rows in the fit's units: design matrix, target and weights."""
        X, y, weights = self.kept(chunk)
        n_rows, n_features = X.shape
        Z = np.empty((n_rows, n_features + self.fit_intercept))
        features = Z[:, :n_features]
        np.divide(X, self.extent, out=features)
        if self.fit_intercept:
            features -= self.feature_mean
            Z[:, n_features] = 1.0
        features /= self.spread
        features /= self.row_norm
        return Z, (y - self.y_mean) / self.y_scale, weights


# The passes: module-level functions of one chunk (a cluster's tasks run them by name).


def _totals_of(chunk: Chunk) -> dict[str, Any]:
    """Rows and weights of positive weight, and the extents of the columns and of y."""
    weights = chunk.sample_weight
    X, y = chunk.X, chunk.y
    if weights is not None:
        positive = weights > 0
        X, y, weights = X[positive], y[positive], weights[positive]
    n_features = chunk.X.shape[1]
    return {
        "rows": [int(y.size)],
        "weight": float(y.size if weights is None else weights.sum()),
        "weight_min": float(weights.min()) if weights is not None and weights.size else np.inf,
        "weight_max": float(weights.max()) if weights is not None and weights.size else -np.inf,
        "x_extent": np.abs(X).max(axis=0) if y.size else np.zeros(n_features),
        "y_extent": float(np.abs(y).max()) if y.size else 0.0,
    }


def _combine_totals(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {
        "rows": first["rows"] + second["rows"],
        "weight": first["weight"] + second["weight"],
        "weight_min": min(first["weight_min"], second["weight_min"]),
        "weight_max": max(first["weight_max"], second["weight_max"]),
        "x_extent": np.maximum(first["x_extent"], second["x_extent"]),
        "y_extent": max(first["y_extent"], second["y_extent"]),
    }


def _means_of(chunk: Chunk, design: Design) -> FloatArray:
    """(Weighted) sums of the features over their extents, then of y."""
    X, y, weights = design.kept(chunk)
    features = design.features(X)
    if weights is None:
        return np.concatenate([features.sum(axis=0), [y.sum()]])
    return np.concatenate([weights @ features, [weights @ y]])


def _spreads_of(chunk: Chunk, design: Design) -> FloatArray:
    """(Weighted) sums of the centred features' squares, then the largest |y - y_mean|."""
    X, y, weights = design.kept(chunk)
    features = design.features(X)
    squares = (
        np.einsum("ij,ij->j", features, features)
        if weights is None
        else np.einsum("i,ij,ij->j", weights, features, features)
    )
    y_extent = float(np.abs(y - design.y_mean).max()) if y.size else 0.0
    return np.concatenate([squares, [y_extent]])


def _row_norm_of(chunk: Chunk, design: Design) -> float:
    """The largest squared norm of a standardized row."""
    X, _, _ = design.kept(chunk)
    if X.shape[0] == 0:
        return 0.0
    features = design.features(X)
    features /= design.spread
    return float(np.max(np.einsum("ij,ij->i", features, features)))


def _gathered_of(
    chunk: Chunk, design: Design, rows: NDArray[np.intp], offsets: NDArray[np.int64]
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """The scaled rows among ``rows`` (indices among all kept rows) that this chunk holds."""
    start, stop = offsets[chunk.index], offsets[chunk.index + 1]
    here = rows[(rows >= start) & (rows < stop)] - start
    Z, y, weights = design.scaled(chunk)
    return Z[here], y[here], None if weights is None else weights[here]


def _polish_of(
    chunk: Chunk, design: Design, thetas: FloatArray, fitted_on: FloatArray | None
) -> dict[str, Any]:
    """One iteration of classical AM for many starts over one chunk.

    Per start: the (weighted) sum of the rows' smallest squared residuals under ``thetas``, the
    rows whose line differs from the one they had under ``fitted_on`` (the lines before the
    last refit), each line's rows and the uncentred cross-products of its rows' ``[z, y]``
    (weighted), from which the next refit's normal equations are read.
    """
    Z, y, weights = design.scaled(chunk)
    n_starts, k, n_params = thetas.shape
    squared, labels = assign_many(Z, y, thetas)
    loss = squared.sum(axis=1) if weights is None else squared @ weights
    moved = np.zeros(n_starts, dtype=np.int64)
    if fitted_on is not None:
        _, previous = assign_many(Z, y, fitted_on)
        moved = (labels != previous).sum(axis=1)
    augmented = np.column_stack([Z, y])
    if weights is not None:
        augmented *= np.sqrt(weights)[:, None]
    sums = np.zeros((n_starts, k, n_params + 1, n_params + 1))
    counts = np.zeros((n_starts, k), dtype=np.int64)
    for start in range(n_starts):
        counts[start] = np.bincount(labels[start], minlength=k)
        for line, rows in _rows_by_label(augmented, labels[start], k):
            sums[start, line] = rows.T @ rows
    return {"loss": loss, "moved": moved, "sums": sums, "counts": counts}


def _moments_of(chunk: Chunk, design: Design, theta: FloatArray) -> tuple[_Moments, FloatArray]:
    """Each line's centred moments of ``[features, y]`` over the rows it wins, and its rows.

    As :func:`~mixreg._lstsq.refit_exactly` forms them, block by block.
    """
    Z, y, weights = design.scaled(chunk)
    centre = design.fit_intercept
    k, n_params = theta.shape
    _, labels = assign_many(Z, y, theta[None])
    labels = labels[0]
    moments = _Moments.zeros(k, n_params - centre + 1)
    rows_per_block = _block_rows(n_params)
    for begin in range(0, Z.shape[0], rows_per_block):
        block = slice(begin, begin + rows_per_block)
        augmented = _augmented(Z[block], y[block], centre)
        if weights is None:
            for line, rows in _rows_by_label(augmented, labels[block], k):
                moments.add(line, rows, centre)
            continue
        weighted = np.column_stack([augmented, weights[block]])
        for line, rows in _rows_by_label(weighted, labels[block], k):
            moments.add(line, rows[:, :-1], centre, rows[:, -1])
    return moments, np.bincount(labels, minlength=k).astype(np.float64)


def _merged_moments(
    first: tuple[_Moments, FloatArray], second: tuple[_Moments, FloatArray]
) -> tuple[_Moments, FloatArray]:
    """Two chunks' moments merged part by part (Chan's pairwise update, as ``_Moments.add``)."""
    merged, other = first[0], second[0]
    total = merged.weight + other.weight
    both = (merged.weight > 0) & (other.weight > 0)
    only_other = (merged.weight <= 0) & (other.weight > 0)
    delta = other.mean - merged.mean
    factor = np.where(both, merged.weight * other.weight / np.where(both, total, 1.0), 0.0)
    scatter = (
        merged.scatter
        + other.scatter
        + factor[:, None, None] * np.einsum("pi,pj->pij", delta, delta)
    )
    mean = merged.mean.copy()
    mean[both] += delta[both] * (other.weight[both] / total[both])[:, None]
    mean[only_other] = other.mean[only_other]
    return _Moments(total, mean, scatter), first[1] + second[1]


def _correction_of(
    chunk: Chunk, design: Design, partition_lines: FloatArray, fitted: FloatArray, mean: FloatArray
) -> FloatArray:
    """The corrected semi-normal equations' new sums, as :func:`~mixreg._lstsq.refit_exactly`:
    per line, the centred features' cross-products with the residuals of ``fitted`` over the
    rows ``partition_lines`` gives it, then the residuals' sum (weighted)."""
    Z, y, weights = design.scaled(chunk)
    centre = design.fit_intercept
    k, n_params = fitted.shape
    n_x = n_params - centre
    _, labels = assign_many(Z, y, partition_lines[None])
    labels = labels[0]
    sums = np.zeros((k, n_x + 1))
    rows_per_block = _block_rows(n_params)
    for begin in range(0, Z.shape[0], rows_per_block):
        block = slice(begin, begin + rows_per_block)
        residual = y[block] - np.einsum("ij,ij->i", Z[block], fitted[labels[block]])
        if weights is not None:
            residual *= weights[block]
        augmented = _augmented(Z[block], residual, centre)
        for line, rows in _rows_by_label(augmented, labels[block], k):
            centred = rows[:, :n_x] - mean[line, :n_x]
            sums[line, :n_x] += centred.T @ rows[:, n_x]
            sums[line, n_x] += rows[:, n_x].sum()
    return sums


def _loss_of(chunk: Chunk, design: Design, theta: FloatArray, other: FloatArray) -> FloatArray:
    """The (weighted) sum of smallest squared residuals under ``theta``, and the rows whose
    line under ``theta`` differs from theirs under ``other``."""
    Z, y, weights = design.scaled(chunk)
    squared, labels = assign_many(Z, y, np.stack([theta, other]))
    loss = squared[0].sum() if weights is None else squared[0] @ weights
    return np.array([loss, float((labels[0] != labels[1]).sum())])


def _summary_of(
    chunk: Chunk, design: Design, theta: FloatArray, coef: FloatArray, intercept: FloatArray
) -> FloatArray:
    """Per line: rows, then their weights; then the scaled and the caller-unit (weighted) sums
    of the smallest squared residuals (the caller's from the caller's lines, as
    :func:`~mixreg._loss.weighted_min_loss` computes them)."""
    X, y_caller, weights = design.kept(chunk)
    Z, y, _ = design.scaled(chunk)
    k = theta.shape[0]
    squared, labels = assign_many(Z, y, theta[None])
    row_weight = np.ones(y.size) if weights is None else weights
    caller = row_min_losses(y_caller, predict_lines(X, coef, intercept))
    return np.concatenate(
        [
            np.bincount(labels[0], minlength=k),
            np.bincount(labels[0], weights=row_weight, minlength=k),
            [squared[0] @ row_weight, caller @ row_weight],
        ]
    )


def _added(first: Any, second: Any) -> Any:
    if isinstance(first, dict):
        return {name: first[name] + second[name] for name in first}
    return first + second


class StreamedFit:
    """The steps over all rows of one streamed fit (:class:`~mixreg._solvers.StreamedRows`).

    Parameters
    ----------
    source : ChunkSource
        The fit's rows.
    fit_intercept : bool
    """

    def __init__(self, source: ChunkSource, fit_intercept: bool) -> None:
        self.source = source
        self.passes = 0
        """Passes over the rows so far."""
        totals = self._reduce(_combine_totals, _totals_of)
        self.n_rows = int(sum(totals["rows"]))
        if self.n_rows == 0:
            raise ValueError("sample_weight: every weight is zero; no rows to fit")
        self.kept_offsets = np.concatenate([[0], np.cumsum(totals["rows"])])
        weighted = source.has_weights and totals["weight_min"] < totals["weight_max"]
        self.total_weight = float(totals["weight"]) if weighted else float(self.n_rows)
        self.design, self.scaling, self.x_mean = self._scaling(totals, weighted, fit_intercept)

    def _reduce(
        self, combine: Callable[[Any, Any], Any], function: Callable[..., Any], *args: Any
    ) -> Any:
        """One pass: ``function(chunk, *args)`` over every chunk, combined in chunk order."""
        self.passes += 1
        return reduce(combine, self.source.map(function, *args))

    def _scaling(
        self, totals: dict[str, Any], weighted: bool, fit_intercept: bool
    ) -> tuple[Design, Scaling, FloatArray]:
        """The constants of :class:`~mixreg._scaling.Scaling` from three more passes, and
        the (weighted) mean of the caller's features."""
        from ._scaling import MAX_ABS_Y, Scaling

        y_extent = float(totals["y_extent"])
        if y_extent > MAX_ABS_Y:
            raise ValueError(
                f"|y| reaches {y_extent:.3g}: squared errors of such values overflow a float64; "
                f"scale y down (|y| <= {MAX_ABS_Y:.0e})"
            )
        _, exponent = np.frexp(totals["x_extent"])
        extent = np.ldexp(1.0, np.minimum(exponent, 1023))
        design = Design(weighted=weighted, fit_intercept=fit_intercept, extent=extent)
        means = self._reduce(_added, _means_of, design) / self.total_weight
        feature_mean = means[:-1] if fit_intercept else np.zeros(extent.size)
        y_mean = float(means[-1]) if fit_intercept else 0.0
        design = Design(
            weighted=weighted,
            fit_intercept=fit_intercept,
            extent=extent,
            feature_mean=feature_mean,
            y_mean=y_mean,
        )
        spreads = self._reduce(
            lambda a, b: np.concatenate([a[:-1] + b[:-1], [max(a[-1], b[-1])]]),
            _spreads_of,
            design,
        )
        spread = np.sqrt(spreads[:-1] / self.total_weight)
        spread[spread <= np.finfo(np.float64).tiny] = 1.0
        design = Design(
            weighted=weighted,
            fit_intercept=fit_intercept,
            extent=extent,
            feature_mean=feature_mean,
            spread=spread,
            y_mean=y_mean,
        )
        row_norm = float(np.sqrt(self._reduce(max, _row_norm_of, design)))
        row_norm = row_norm if row_norm > 0.0 else 1.0
        y_scale = float(spreads[-1]) or 1.0
        design = Design(
            weighted=weighted,
            fit_intercept=fit_intercept,
            extent=extent,
            feature_mean=feature_mean,
            spread=spread,
            row_norm=row_norm,
            y_mean=y_mean,
            y_scale=y_scale,
        )
        scaling = Scaling(
            x_mean=feature_mean * extent,
            x_scale=extent * spread * row_norm,
            y_mean=y_mean,
            y_scale=y_scale,
            fit_intercept=fit_intercept,
        )
        return design, scaling, means[:-1] * extent

    def gather(self, rows: NDArray[np.intp]) -> tuple[FloatArray, FloatArray, FloatArray | None]:
        """The scaled design, target and weights of the sorted kept rows ``rows``."""
        parts = list(self._pass(_gathered_of, self.design, rows, self.kept_offsets))
        Z = np.concatenate([part[0] for part in parts])
        y = np.concatenate([part[1] for part in parts])
        weights = None if not self.design.weighted else np.concatenate([part[2] for part in parts])
        return Z, y, weights

    def _pass(self, function: Callable[..., Any], *args: Any) -> list[Any]:
        self.passes += 1
        return list(self.source.map(function, *args))

    def least_squares(self) -> FloatArray:
        """The least-squares line of all rows (the one part of a one-line fit)."""
        n_params = self.design.extent.size + self.design.fit_intercept
        moments, _ = self._reduce(
            _merged_moments, _moments_of, self.design, np.zeros((1, n_params))
        )
        line: FloatArray = moments.solve(self.design.fit_intercept)[0]
        return line

    def polish(
        self,
        thetas: FloatArray,
        *,
        max_iter: int,
        tol: float,
        deadline: float | None,
        callback: StepCallback | None,
    ) -> BatchResult:
        """Classical AM from many starts, one pass an iteration, stopping each start as
        :func:`~mixreg._am.classic_am_batch` does (its partition stops changing, its min-loss
        changed by a relative ``tol`` or less, ``max_iter`` or ``deadline``)."""
        thetas = np.array(thetas, dtype=np.float64)
        n_starts = thetas.shape[0]
        histories: list[list[float]] = [[] for _ in range(n_starts)]
        n_iter = np.zeros(n_starts, dtype=np.intp)
        converged = np.zeros(n_starts, dtype=bool)
        active = np.arange(n_starts)
        fitted_on: FloatArray | None = None
        best_so_far = np.inf
        for iteration in range(max_iter + 1):
            sums = self._reduce(_added, _polish_of, self.design, thetas[active], fitted_on)
            losses = sums["loss"] / self.total_weight
            settled = np.zeros(active.size, dtype=bool)
            if iteration > 0:
                previous = np.array([histories[start][-1] for start in active])
                change = np.abs(previous - losses) / np.maximum(
                    np.abs(previous), np.finfo(np.float64).tiny
                )
                settled = (change <= tol) | (sums["moved"] == 0)
            for start, loss in zip(active, losses.tolist(), strict=True):
                histories[start].append(loss)
            best_so_far = min(best_so_far, float(losses.min()))
            if iteration > 0 and callback is not None:
                callback(iteration, best_so_far)
            converged[active[settled]] = True
            keep = ~settled
            active = active[keep]
            out_of_time = deadline is not None and time.monotonic() > deadline
            if active.size == 0 or iteration == max_iter or out_of_time:
                break
            counts = sums["counts"][keep]
            fitted = _solved(sums["sums"][keep], counts)
            fitted_on = thetas[active].copy()
            thetas[active] = np.where((counts > 0)[:, :, None], fitted, thetas[active])
            n_iter[active] += 1
        return BatchResult(
            thetas=thetas, loss_histories=histories, n_iter=n_iter, converged=converged
        )

    def loss(self, theta: FloatArray) -> float:
        """The (weighted) min-loss of ``theta`` in the fit's units."""
        return (
            float(self._reduce(_added, _loss_of, self.design, theta, theta)[0]) / self.total_weight
        )

    def refit_exactly_until_stable(self, theta: FloatArray, deadline: float | None) -> FloatArray:
        """:func:`~mixreg._am.refit_exactly_until_stable` over the chunks: each line refitted
        to working precision on the rows it wins (centred moments, then one correction) until
        the partition is stable, a few rounds at most; the min-loss never increases."""
        centre = self.design.fit_intercept
        loss = self.loss(theta)
        for _ in range(_EXACT_REFIT_ROUNDS):
            moments, counts = self._reduce(_merged_moments, _moments_of, self.design, theta)
            used = moments.weight > 0
            fitted = np.zeros_like(theta)
            if used.any():
                fitted[used] = moments.subset(used).solve(centre)
                sums = self._reduce(
                    _added, _correction_of, self.design, theta, fitted, moments.mean
                )
                n_x = theta.shape[1] - centre
                scatter = moments.scatter[used][:, :n_x, :n_x]
                correction = solve_normal_equations(scatter, sums[used, :n_x])
                fitted[used, :n_x] += correction
                if centre:
                    residual_mean = sums[used, n_x] / moments.weight[used]
                    fitted[used, n_x] += residual_mean - np.einsum(
                        "px,px->p", moments.mean[used, :n_x], correction
                    )
            candidate = np.where((counts > 0)[:, None], fitted, theta)
            new_loss, changed = self._reduce(_added, _loss_of, self.design, candidate, theta)
            new_loss /= self.total_weight
            if new_loss > loss * (1.0 + 1e-12):
                break
            theta, loss = candidate, new_loss
            if changed == 0 or (deadline is not None and time.monotonic() > deadline):
                break
        return theta

    def summary(
        self, theta: FloatArray, coef: FloatArray, intercept: FloatArray
    ) -> tuple[NDArray[np.intp], FloatArray, float, float]:
        """Rows and weight share of each line under ``theta``, and the min-loss in the fit's
        units and in the caller's (of ``coef``, ``intercept``)."""
        k = theta.shape[0]
        sums = self._reduce(_added, _summary_of, self.design, theta, coef, intercept)
        rows = np.rint(sums[:k]).astype(np.intp)
        shares = sums[k : 2 * k] / float(sums[k : 2 * k].sum())
        return (
            rows,
            shares,
            float(sums[-2]) / self.total_weight,
            float(sums[-1]) / self.total_weight,
        )


def _solved(sums: FloatArray, counts: NDArray[np.int64]) -> FloatArray:
    """Least-squares lines from uncentred ``[z, y]`` cross-products of shape
    (n_starts, k, p + 1, p + 1); zeros for a line without rows."""
    n_params = sums.shape[-1] - 1
    theta = np.zeros((*sums.shape[:-2], n_params))
    filled = counts > 0
    if filled.any():
        chosen = sums[filled]
        theta[filled] = solve_normal_equations(
            chosen[:, :n_params, :n_params], chosen[:, :n_params, n_params]
        )
    return theta


_FITTED_ELSEWHERE = ("group_labels_", "group_line_", "group_posterior_", "candidates_")


def streamed_source(
    X: Any, y: Any, sample_weight: Any, groups: Any, concomitant: Any
) -> ChunkSource | None:
    """The row chunks of streamed inputs to ``fit``, or None for rows in memory.

    ``X`` is a :class:`~mixreg._chunks.ChunkSource` (its chunks hold y and the weights), or a
    dask array or DataFrame with ``y`` (and ``sample_weight``) dask collections of the same
    row chunks. Raises ValueError naming what a streamed fit does not take.
    """
    if isinstance(X, ChunkSource):
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise ValueError(
                    f"{name}: a fit on row chunks reads {name} from the chunks; pass None"
                )
        source: ChunkSource = X
    elif type(X).__module__.split(".")[0] in ("dask", "dask_expr"):
        from ._dask import DaskArrayChunks

        source = DaskArrayChunks(X, y, sample_weight)
    else:
        return None
    for name, value in (("groups", groups), ("concomitant", concomitant)):
        if value is not None:
            raise ValueError(f"{name}: a fit streamed over row chunks takes no {name} yet")
    return source


def fit_streamed(
    estimator: MixtureOfLinearRegressions,
    source: ChunkSource,
    *,
    progress: ProgressCallback | None = None,
) -> MixtureOfLinearRegressions:
    """Fit ``estimator`` (``algorithm="auto"``) on the rows of ``source``, read chunk by chunk.

    The same lines as :meth:`MixtureOfLinearRegressions.fit` on the concatenated chunks (same
    seed) to rounding; sets the same attributes except the maximum-likelihood mixture (no
    standard errors, groups or gate on streamed rows yet: ValueError naming the parameter).
    ``passes_`` counts the passes over the rows.
    """
    from ._auto import fit_auto
    from ._estimator import component_order
    from ._fit_warnings import warn_if_degenerate, warn_if_unconverged
    from ._fitted import remove_optional_results
    from ._loss import single_threaded_blas
    from ._scaling import in_caller_units
    from ._solvers import FitContext
    from ._validation import as_generator

    for name, refused in (("standard_errors", "standard errors"), ("gating", "a gate")):
        if getattr(estimator, name):
            raise ValueError(
                f"{name}: a fit streamed over row chunks has no {refused} yet; fit with "
                f"{name}=False, or on rows held in memory"
            )
    if estimator.algorithm != "auto":
        raise ValueError(
            f"algorithm: a fit streamed over row chunks runs algorithm='auto' only; got "
            f"{estimator.algorithm!r}"
        )
    started = time.monotonic()
    rows = StreamedFit(source, bool(estimator.fit_intercept))
    n_features = source.n_features
    params = estimator.resolved_parameters(rows.n_rows, n_features)
    remove_optional_results(estimator)
    for name in _FITTED_ELSEWHERE:
        if hasattr(estimator, name):
            delattr(estimator, name)
    scaling = rows.scaling
    if params.get("init") is not None:
        params["init"] = scaling.to_scaled(params["init"])
    budget = params.get("time_budget")
    n_params = n_features + bool(estimator.fit_intercept)
    ctx = FitContext(
        Z=np.empty((0, n_params)),
        y=np.empty(0),
        n_components=int(estimator.n_components),
        n_features=n_features,
        params=params,
        rng=as_generator(estimator.random_state),
        deadline=None if budget is None else started + budget,
        started=started,
        loss_scale=scaling.y_scale**2,
        progress=progress,
        streamed=rows,
    )
    with single_threaded_blas():
        result = fit_auto(ctx)
        before = result.loss
        result.theta = rows.refit_exactly_until_stable(result.theta, ctx.deadline)
        coef, intercept = scaling.to_caller(result.theta)
        rows_per_line, shares, scaled_loss, train_loss = rows.summary(result.theta, coef, intercept)
    if scaled_loss < before * (1.0 - 1e-9):
        result.loss_history = [*result.loss_history, scaled_loss]
    order = component_order(coef, intercept, shares, rows.x_mean)
    estimator.coef_ = coef[order]
    estimator.intercept_ = intercept[order]
    estimator.shares_ = shares[order]
    estimator.loss_history_ = in_caller_units(result.loss_history, ctx.loss_scale)
    estimator.train_loss_ = train_loss
    estimator.n_iter_ = result.n_iter
    estimator.n_candidates_ = result.n_candidates
    estimator.converged_ = result.converged
    estimator.n_features_in_ = n_features
    estimator.candidates_ = [candidate.to_dict(ctx.loss_scale) for candidate in result.candidates]
    estimator.passes_ = rows.passes
    warn_if_unconverged(estimator.algorithm, result, params, ctx.deadline)
    warn_if_degenerate(rows_per_line[order].astype(np.float64), n_params)
    ctx.report(
        1.0, iteration=result.n_iter, candidates=result.n_candidates or None, loss=scaled_loss
    )
    return estimator
