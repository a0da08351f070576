"""The algorithms as functions of one fit context: scaled data, parameters, randomness, clock.

Each solver takes a :class:`FitContext` and returns a :class:`~mixreg._am.SolverResult`; the
estimator picks one by name from :data:`SOLVERS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ._am import BatchResult, SolverResult, StepCallback, classic_am_batch, gradient_am
from ._em import EMResult, em_batch
from ._loss import Grouping
from ._lstsq import WeightedLeastSquares, lstsq_by_labels
from ._subsample import (
    exhaustive_partition_batches,
    random_partition_batches,
    stirling2,
    subsample_search,
)

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]


class StreamedRows(Protocol):
    """The steps over all rows of a fit whose rows are read in chunks (:mod:`mixreg._streamed`)."""

    @property
    def n_rows(self) -> int: ...

    def gather(self, rows: NDArray[np.intp]) -> tuple[FloatArray, FloatArray, FloatArray | None]:
        """The scaled design, target and weights of the (sorted) rows ``rows``."""

    def polish(
        self,
        thetas: FloatArray,
        *,
        max_iter: int,
        tol: float,
        deadline: float | None,
        callback: StepCallback | None,
    ) -> BatchResult:
        """:func:`~mixreg._am.classic_am_batch` on all rows."""

    def least_squares(self) -> FloatArray:
        """The least-squares line of all rows: shape (n_params,)."""


# Share of the progress fraction given to the sub-sample phase of "subsample+am".
_SUBSAMPLE_PHASE = 0.8


@dataclass
class FitContext:
    """What every solver of a fit needs: scaled data, parameters, randomness, clock, progress."""

    Z: FloatArray
    y: FloatArray
    n_components: int
    n_features: int
    params: dict[str, Any]
    rng: np.random.Generator
    deadline: float | None
    started: float
    loss_scale: float
    progress: ProgressCallback | None
    sample_weight: FloatArray | None = None
    """Positive row weights (None: every row weighs 1)."""
    grouping: Grouping | None = None
    """Rows bound to one line together (None: every row on its own)."""
    streamed: StreamedRows | None = None
    """Where the fit's rows are when they are not in ``Z`` (a fit streamed over row chunks,
    :mod:`mixreg._streamed`: ``Z`` then holds no rows); None: ``Z`` holds every row."""

    def report(
        self,
        fraction: float,
        *,
        iteration: int | None = None,
        candidates: int | None = None,
        loss: float | None = None,
    ) -> None:
        if self.progress is None:
            return
        budget = self.params.get("time_budget")
        if budget is not None:
            fraction = max(fraction, (time.monotonic() - self.started) / budget)
        self.progress(
            min(max(fraction, 0.0), 1.0),
            {
                "iteration": iteration,
                "candidates_tried": candidates,
                "best_loss": None if loss is None else loss * self.loss_scale,
            },
        )

    @cached_property
    def least_squares(self) -> WeightedLeastSquares:
        """The rows' least-squares products, formed once for every batch of the fit that
        refits lines on these rows (a context of other rows, made by ``replace``, forms its
        own)."""
        return WeightedLeastSquares(self.Z, self.y)

    @property
    def n_rows(self) -> int:
        """Rows of the fit (all of them, streamed or not)."""
        return int(self.Z.shape[0]) if self.streamed is None else self.streamed.n_rows

    @property
    def fit_intercept(self) -> bool:
        return bool(self.Z.shape[1] > self.n_features)

    @property
    def min_samples(self) -> int:
        # RANSACRegressor's default: one more row than there are features.
        return self.n_features + 1


def random_lines(ctx: FitContext) -> FloatArray:
    """Gaussian lines in the scaled space (the paper's random initialization of Algorithm 1)."""
    lines: FloatArray = ctx.rng.standard_normal((ctx.n_components, ctx.Z.shape[1]))
    return lines


def random_partition_lines(ctx: FitContext, count: int) -> FloatArray:
    """Least-squares lines of ``count`` random partitions of the rows (flexmix's default
    start); with groups, random partitions of the groups.

    Each partition is its own draw from the generator, as if drawn one call at a time; the
    partitions are solved together (one product for all their parts).

    Returns
    -------
    ndarray of shape (count, n_components, n_params)
    """
    units = ctx.Z.shape[0] if ctx.grouping is None else ctx.grouping.n_groups
    labels = np.stack(
        [
            np.asarray(ctx.rng.integers(0, ctx.n_components, size=units), dtype=np.intp)
            for _ in range(count)
        ]
    )
    if ctx.grouping is not None:
        labels = labels[:, ctx.grouping.codes]
    theta, _ = lstsq_by_labels(
        ctx.Z,
        ctx.y,
        labels,
        ctx.n_components,
        sample_weight=ctx.sample_weight,
        row_products=ctx.least_squares.products,
    )
    return theta


def _quality(result: SolverResult) -> float:
    """What restarts compare, lower is better: EM's negative final log-likelihood (EM
    maximizes it, not the min-loss), the min-loss for the other algorithms."""
    if isinstance(result, EMResult) and result.log_likelihood_history:
        return -result.log_likelihood_history[-1]
    return result.loss


def restarts(
    ctx: FitContext,
    solve: Callable[..., SolverResult],
    random_start: Callable[[FitContext], FloatArray],
) -> SolverResult:
    """Run ``n_init`` starts (or the given ``init``) and keep the best (see :func:`_quality`)."""
    n_init, max_iter = ctx.params["n_init"], ctx.params["max_iter"]
    results: list[SolverResult] = []
    for start in range(n_init):
        theta0 = ctx.params["init"] if ctx.params["init"] is not None else random_start(ctx)
        best_so_far = min((result.loss for result in results), default=np.inf)

        def on_step(
            iteration: int, loss: float, start: int = start, floor: float = best_so_far
        ) -> None:
            ctx.report(
                (start + iteration / max_iter) / n_init, iteration=iteration, loss=min(loss, floor)
            )

        results.append(solve(theta0, callback=on_step))
        if ctx.deadline is not None and time.monotonic() > ctx.deadline:
            break
    return min(results, key=_quality)


def iterative(
    solver: Callable[..., SolverResult],
    random_start: Callable[[FitContext], FloatArray],
    *extra_params: str,
) -> Callable[[FitContext], SolverResult]:
    """An iterative algorithm (gradient AM) run from ``n_init`` starts, one after the other."""

    def fit(ctx: FitContext) -> SolverResult:
        p = ctx.params
        solve = partial(
            solver,
            ctx.Z,
            ctx.y,
            max_iter=p["max_iter"],
            tol=p["tol"],
            deadline=ctx.deadline,
            sample_weight=ctx.sample_weight,
            **{name: p[name] for name in extra_params},
        )
        return restarts(ctx, solve, random_start)

    return fit


def _subsample(ctx: FitContext, size: int) -> NDArray[np.intp]:
    """The sub-sample A: ``size`` rows drawn with replacement, uniformly or, with sample
    weights, with probability proportional to their weight (a weighted row is drawn as
    often as its copies would be)."""
    if ctx.sample_weight is None:
        rows: NDArray[np.intp] = ctx.rng.integers(0, ctx.Z.shape[0], size=size)
        return rows
    probability = ctx.sample_weight / ctx.sample_weight.sum()
    drawn: NDArray[np.intp] = ctx.rng.choice(ctx.Z.shape[0], size=size, p=probability)
    return drawn


def _search(
    ctx: FitContext,
    batches: Iterator[NDArray[np.intp]],
    *,
    size: int,
    total: int,
    phase: float = 1.0,
    deadline: float | None = None,
) -> SolverResult:
    """Algorithms 2 and 3 on a fresh sub-sample of ``size`` rows, reporting progress."""
    return subsample_search(
        ctx.Z,
        ctx.y,
        batches,
        subsample=_subsample(ctx, size),
        n_components=ctx.n_components,
        base=ctx.params["base"],
        rng=ctx.rng,
        min_samples=ctx.min_samples,
        fit_intercept=ctx.fit_intercept,
        deadline=deadline if deadline is not None else ctx.deadline,
        callback=lambda tried, loss: ctx.report(phase * tried / total, candidates=tried, loss=loss),
        sample_weight=ctx.sample_weight,
    )


def fit_subsample(
    ctx: FitContext, *, phase: float = 1.0, deadline: float | None = None
) -> SolverResult:
    """Algorithm 3: random partitions of the sub-sample."""
    size, total = ctx.params["subsample_size"], ctx.params["n_partitions"]
    # The sub-sample is drawn before the partitions (the generator is consumed lazily).
    batches = random_partition_batches(ctx.rng, total, size, ctx.n_components)
    return _search(ctx, batches, size=size, total=total, phase=phase, deadline=deadline)


def fit_subsample_exhaustive(ctx: FitContext) -> SolverResult:
    """Algorithm 2: every partition of the sub-sample."""
    size = ctx.params["subsample_size"]
    batches = exhaustive_partition_batches(size, ctx.n_components)
    return _search(ctx, batches, size=size, total=stirling2(size, ctx.n_components))


def fit_subsample_am(ctx: FitContext) -> SolverResult:
    """The paper's A3: Algorithm 3, then Algorithm 1 started from its lines."""
    p = ctx.params
    search_deadline = None
    if ctx.deadline is not None:
        # The budget covers the whole fit: most of it for the anytime search, the rest for AM.
        search_deadline = ctx.started + _SUBSAMPLE_PHASE * (ctx.deadline - ctx.started)
    initial = fit_subsample(ctx, phase=_SUBSAMPLE_PHASE, deadline=search_deadline)
    refined = gradient_am(
        ctx.Z,
        ctx.y,
        initial.theta,
        step_size=p["step_size"],
        max_iter=p["max_iter"],
        tol=p["tol"],
        deadline=ctx.deadline,
        sample_weight=ctx.sample_weight,
        callback=lambda iteration, loss: ctx.report(
            _SUBSAMPLE_PHASE + (1 - _SUBSAMPLE_PHASE) * iteration / p["max_iter"],
            iteration=iteration,
            candidates=initial.n_candidates,
            loss=loss,
        ),
    )
    refined.loss_history = initial.loss_history + refined.loss_history[1:]
    refined.n_candidates = initial.n_candidates
    return refined


def starting_lines(
    ctx: FitContext, random_starts: Callable[[FitContext, int], FloatArray], count: int
) -> FloatArray:
    """``count`` random starts (or the given ``init``), shape (count, n_components, n_params).

    ``random_starts(ctx, count)`` draws the starts, e.g. :func:`random_partition_lines`.
    """
    if ctx.params.get("init") is not None:
        return np.asarray(ctx.params["init"], dtype=np.float64)[None]
    return random_starts(ctx, count)


def fit_classic_am(ctx: FitContext) -> SolverResult:
    """Classical AM from ``n_init`` random-partition starts, polished together as one batch."""
    p = ctx.params
    starts = starting_lines(ctx, random_partition_lines, p["n_init"])
    batch = classic_am_batch(
        ctx.Z,
        ctx.y,
        starts,
        max_iter=p["max_iter"],
        tol=p["tol"],
        deadline=ctx.deadline,
        callback=lambda iteration, loss: ctx.report(
            iteration / p["max_iter"], iteration=iteration, loss=loss
        ),
        sample_weight=ctx.sample_weight,
        grouping=ctx.grouping,
    )
    best = int(np.argmin(batch.losses))
    return SolverResult(
        theta=batch.thetas[best],
        loss_history=batch.loss_histories[best],
        n_iter=int(batch.n_iter[best]),
        converged=bool(batch.converged[best]),
    )


def fit_em(ctx: FitContext) -> SolverResult:
    """EM from ``n_init`` random-partition starts (flexmix's), run together as one batch; the
    best by :func:`_quality` (the highest final log-likelihood, the first of equals) wins.

    The starts are drawn as :func:`restarts` draws them, one after the other, and EM uses no
    randomness, so each start ends as it would alone; a batch pays the per-iteration overhead
    of small data once for all its starts.
    """
    p = ctx.params
    starts = starting_lines(ctx, random_partition_lines, p["n_init"])
    batch = em_batch(
        ctx.Z,
        ctx.y,
        starts,
        max_iter=p["max_iter"],
        tol=p["tol"],
        deadline=ctx.deadline,
        callback=lambda iteration, loss: ctx.report(
            iteration / p["max_iter"], iteration=iteration, loss=loss
        ),
        sample_weight=ctx.sample_weight,
        grouping=ctx.grouping,
    )
    return min((batch.start(index) for index in range(starts.shape[0])), key=_quality)


SOLVERS: dict[str, Callable[[FitContext], SolverResult]] = {
    "am": iterative(gradient_am, random_lines, "step_size"),
    "am-classic": fit_classic_am,
    "subsample": fit_subsample,
    "subsample-exhaustive": fit_subsample_exhaustive,
    "subsample+am": fit_subsample_am,
    "em": fit_em,
}

GROUPED_ALGORITHMS = ("auto", "am-classic", "em")
"""The algorithms that fit grouped rows (every row of a group on one line)."""
