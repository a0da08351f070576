"""``algorithm="auto"``: candidates from every source, polished by classical AM, then searched
around until the search stops improving; the best wins.

The min-loss is NP-hard to minimize and every algorithm of the paper is a heuristic that
sometimes lands in a poor local minimum. Classical AM (assign each row to its best line, refit
each line by least squares) never increases the min-loss, so any set of lines it starts from
ends at least as good as it began. The search therefore collects starting line sets from
several sources that fail in different ways — random restarts, the paper's A3 (Algorithm 3
with least squares, then Algorithm 1), Algorithm 3 with RANSAC, and EM restarts — and polishes
every one of them by classical AM.

With many lines on non-linear data, classical AM has many poor local minima, and more random
starts find better ones only slowly. A poor minimum is usually wrong in a few places, so the
search then runs rounds of moves from the best line set (:mod:`mixreg._moves`: split a line
that fits its rows badly and free a slot elsewhere; move a line to where the others fit worst;
replace a line by a fresh one), and batches of fresh random starts with rounds of their own,
for as long as they improve the best: a patience rule, under a cap on the work (or the time
budget). Every batch is screened: its starts run a few iterations and only the best of each
source go on, to a looser tolerance than the fit's; the finalists are polished to ``tol``.

On many rows the search runs on a uniform sample of :data:`SEARCH_ROWS` rows; the finalists
(the best candidate and those the sample cannot tell from it) are polished again on all rows.

With groups the search is over assignments of whole groups, which EM finds cheaply: a group's
posterior is the product of its rows' densities, so it is nearly hard after a few iterations.
The search therefore starts with grouped EM from ``n_init`` random partitions of the groups
(:data:`MAX_EM_RESTARTS` at most; the starts ``algorithm="em"`` draws from the same seed and
``n_init``), polished by grouped classical AM,
and stops there when at least half of them (:data:`AGREEING_SHARE`, two at least) reach the
best min-loss: starts that agree so often have found a minimum that more starts seldom beat
(as on data with one clear partition). Otherwise the other sources, the moves and the
restarts follow as without groups. A grouped fit also reports the maximum-likelihood mixture
(:func:`mixreg._grouped_mixture.grouped_mixture`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._am import BatchResult, SolverResult, assign_many, classic_am_batch
from ._em import EMResult, em_batch
from ._lstsq import WIDE_MIN_PARAMS, lstsq_row_sets
from ._moves import reseed_by_residual, split_and_free
from ._solvers import (
    FitContext,
    fit_subsample,
    fit_subsample_am,
    random_partition_lines,
    starting_lines,
)

FloatArray = NDArray[np.float64]

SEARCH_ROWS = 20_000
"""Above this many rows, the sources and the first polish run on a sample of this many rows."""
MIN_FINALISTS, MAX_FINALISTS = 3, 8
"""Bounds on the candidates of the search that are polished again on all rows."""
TRUSTED_GAP = 2.0
"""Candidates whose sample min-loss is within this many standard errors of the best's are
polished on all rows too: the sample cannot tell them apart."""
MIN_N_INIT, MAX_N_INIT = 4, 100
# Work (multiply-adds of the batched refit, summed over the random starts' iterations) that
# the size-aware default of n_init aims at: a few tenths of a second on one core.
_RANDOM_START_WORK = 1e9
_TYPICAL_POLISH_ITERATIONS = 30
# EM restarts run beside the random starts: as R's flexmix and mixtools users do, 10 at most.
MAX_EM_RESTARTS = 10
# Starts of each move per round of the local search around the best.
SPLITS, RESEEDS, REPLACEMENTS = 8, 8, 4
PATIENCE = 3
"""Rounds of moves stop after this many in a row that improved the best by IMPROVEMENT or less."""
IMPROVEMENT = 1e-4
"""Relative improvement of the best min-loss that counts as progress."""
MAX_ROUNDS = 1000
EXPLORE_TOL = 1e-4
"""Relative change of the min-loss at which the search stops polishing a candidate; the
finalists are then polished to the fit's own ``tol``."""
RESTART_PATIENCE = 2
RESTARTS = 20
"""Random starts of each batch of restarts at most (``n_init`` of them, when fewer)."""
"""Batches of fresh random starts (each searched around) in a row that did not improve the
best, after which the search stops."""
AGREEMENT = 1e-3
"""Relative difference of two batches' best min-losses within which they found the same
minimum (the search polishes to :data:`EXPLORE_TOL`, so equal minima differ by less)."""
DISAGREEMENT_BATCHES = 8
"""Batches of restarts at most beyond the patience rule while the batches disagree."""
DISAGREEMENT_CAP_FACTOR = 3.0
"""The work cap is this many times larger while the batches disagree."""
MIN_CAP_SECONDS, MAX_CAP_SECONDS = 5.0, 40.0
CAP_SECONDS_PER_WORK = 2e-5
WORK_PER_SECOND = 1e9
SCREEN_ITERATIONS = 5
SURVIVORS = 3
# EM's own defaults (those of algorithm="em"): the grouped EM starts and the maximum-likelihood
# mixture of a grouped fit run to them.
EM_MAX_ITER, EM_TOL = 200, 1e-6
# The EM restarts of the search only give starting lines for classical AM: on slowly
# converging data (EM's linear convergence) their later iterations creep towards the fixed
# point the polish reaches anyway, at the cost of an E-step (k exponentials per row) each. A
# quarter of algorithm="em"'s 200 iterations.
EM_RESTART_MAX_ITER = 50
EM_RESTART_MIN_ITER = 5
_EM_RESTART_WIDE_WORK = 4e9
AGREEING_SHARE = 0.5
"""With groups, the search stops after its EM starts when at least this share of them (and at
least two), polished, reach the best min-loss (within :data:`SAME_MIN_LOSS`): on data with
many nearly equal minima a few starts may meet at a poor one, seldom half of them."""
SAME_MIN_LOSS = 1e-6
"""Relative difference of two polished candidates' min-losses below which they count as the
same minimum (a polish that stops at ``tol`` leaves about that much)."""
# Algorithm 3 with RANSAC fits ~20 trial lines per part: it gets a fifth of the partitions
# the least-squares search gets, for a comparable cost.
_RANSAC_PARTITION_SHARE = 5


def default_n_init(n_samples: int, n_params: int, n_components: int) -> int:
    """Random starts of ``auto`` for data of this size: many on small data, few on large.

    Parameters
    ----------
    n_samples : int
        Training rows.
    n_params : int
        Features, plus one when an intercept is fitted.
    n_components : int

    Returns
    -------
    int
        Between :data:`MIN_N_INIT` and :data:`MAX_N_INIT`.
    """
    rows = min(n_samples, SEARCH_ROWS)
    per_start = n_components * rows * n_params * n_params * _TYPICAL_POLISH_ITERATIONS
    return int(np.clip(_RANDOM_START_WORK // max(per_start, 1), MIN_N_INIT, MAX_N_INIT))


def em_restart_iterations(n_rows: int, n_params: int, n_components: int) -> int:
    """Iterations of the search's EM restarts: :data:`EM_RESTART_MAX_ITER`, fewer on wide data.

    Each EM iteration sums every line's weighted moments over all rows (``n k p^2``); on wide
    data (more than :data:`~mixreg._lstsq.WIDE_MIN_PARAMS` parameters) the restarts get the
    work of :data:`_EM_RESTART_WIDE_WORK` multiply-adds (:data:`EM_RESTART_MIN_ITER` iterations
    at least): their lines only start classical AM, which then costs the moved rows only.
    """
    if n_params <= WIDE_MIN_PARAMS:
        return EM_RESTART_MAX_ITER
    per_iteration = n_rows * n_components * n_params * n_params
    affordable = int(_EM_RESTART_WIDE_WORK // max(per_iteration, 1))
    return int(np.clip(affordable, EM_RESTART_MIN_ITER, EM_RESTART_MAX_ITER))


def em_restarts(n_init: int) -> int:
    """EM restarts that go with ``n_init`` random starts."""
    return int(np.clip(n_init // 4, 1, MAX_EM_RESTARTS))


@dataclass(frozen=True)
class Candidate:
    """One polished candidate of the search, as reported in ``candidates_``."""

    source: str
    """Where the starting lines came from."""
    min_loss_before: float
    """Training min-loss of the starting lines (on the rows it was polished on)."""
    min_loss_after: float
    """Training min-loss after polishing by classical AM."""
    seconds: float
    """Time of its source and its share of the batched polish."""
    n_iter: int
    """Classical AM iterations of the polish."""
    converged: bool
    """Whether the polish reached a fixed point (or ``tol``) before ``max_iter``."""
    n_rows: int
    """Rows it was polished on: all training rows, or the search sample."""

    def to_dict(self, loss_scale: float) -> dict[str, Any]:
        """The record with losses in the caller's units."""
        return {
            "source": self.source,
            "min_loss_before": self.min_loss_before * loss_scale,
            "min_loss_after": self.min_loss_after * loss_scale,
            "seconds": self.seconds,
            "n_iter": self.n_iter,
            "converged": self.converged,
            "n_rows": self.n_rows,
        }


@dataclass
class AutoResult(SolverResult):
    """The best candidate's lines and polish trace, with every candidate tried."""

    candidates: list[Candidate] = field(default_factory=list)
    em_restart: EMResult | None = None
    """With groups, the EM start of highest likelihood on all training rows (None when the
    search ran on a sample): a candidate for the maximum-likelihood mixture."""


def lines_of_random_rows(ctx: FitContext, count: int) -> FloatArray:
    """``count`` least-squares lines, each of its own small random set of rows.

    Each line is fitted on twice as many rows as it has parameters, drawn without replacement:
    lines spread over the data, as RANSAC's minimal samples are.

    Returns
    -------
    ndarray of shape (count, n_params)
    """
    n_samples, n_params = ctx.Z.shape
    size = min(n_samples, 2 * n_params)
    # With sample weights, rows are drawn in proportion to their weight.
    probability = None if ctx.sample_weight is None else ctx.sample_weight / ctx.sample_weight.sum()
    # Row sets are drawn one line at a time (a short loop over lines, not rows) and gathered:
    # memory is a batch of (lines, 2p, p), never (lines, n_samples) or (n_samples, p^2).
    row_sets = np.stack(
        [ctx.rng.choice(n_samples, size=size, replace=False, p=probability) for _ in range(count)]
    )
    return lstsq_row_sets(ctx.Z, ctx.y, row_sets)


def random_rows_lines(ctx: FitContext, count: int) -> FloatArray:
    """``count`` starting line sets: every line fitted on its own small random set of rows.

    Returns
    -------
    ndarray of shape (count, n_components, n_params)
    """
    return np.stack([lines_of_random_rows(ctx, ctx.n_components) for _ in range(count)])


StartingLines = Callable[[FitContext], FloatArray]
"""A source: a function of the (sample's) fit context that returns starting line sets."""


def _sources(ctx: FitContext) -> list[tuple[str, StartingLines]]:
    """Each source's name and the function that returns its starting lines.

    A source with no starts to give (``n_init=1`` leaves no "random rows" start) is left out.
    """
    p = ctx.params
    n_random = p["n_init"]
    iterations = {"max_iter": p["max_iter"], "tol": p["tol"]}
    search = {"subsample_size": p["subsample_size"], "n_partitions": p["n_partitions"]}

    def random_starts(kind: Callable[[FitContext, int], FloatArray], count: int) -> StartingLines:
        return lambda c: starting_lines(c, kind, count)

    def a3(c: FitContext) -> FloatArray:
        sub = replace(c, params={**search, **iterations, "base": "ls", "step_size": "auto"})
        return fit_subsample_am(sub).theta[None]

    def ransac(c: FitContext) -> FloatArray:
        partitions = max(1, p["n_partitions"] // _RANSAC_PARTITION_SHARE)
        sub = replace(c, params={**search, "n_partitions": partitions, "base": "ransac"})
        return fit_subsample(sub).theta[None]

    def em_starts(c: FitContext) -> FloatArray:
        starts = starting_lines(c, random_partition_lines, em_restarts(n_random))
        max_iter = em_restart_iterations(c.Z.shape[0], c.Z.shape[1], c.n_components)
        return em_batch(
            c.Z,
            c.y,
            starts,
            max_iter=max_iter,
            tol=EM_TOL,
            deadline=c.deadline,
            callback=lambda iteration, loss: c.report(iteration / max_iter, loss=loss),
            sample_weight=c.sample_weight,
            grouping=c.grouping,
            solver=c.least_squares,
        ).thetas

    sources: list[tuple[str, StartingLines]] = [
        ("random partition", random_starts(random_partition_lines, n_random - n_random // 2))
    ]
    if n_random // 2:
        sources.append(("random rows", random_starts(random_rows_lines, n_random // 2)))
    return [*sources, ("subsample+am", a3), ("em", em_starts), ("subsample ransac", ransac)]


class _Search:
    """The candidates polished so far, their lines and traces, and the progress they report."""

    def __init__(self, ctx: FitContext, phases: int) -> None:
        self.ctx = ctx
        self.phases = phases
        self.candidates: list[Candidate] = []
        self.polished: list[FloatArray] = []
        self.histories: list[list[float]] = []
        self.best_loss = np.inf
        self.work = 0.0
        """Multiply-adds of the polish so far (see :func:`default_search_work`)."""

    def report(self, phase: float, loss: float | None = None) -> None:
        """Progress through ``phase`` (counted in phases), with the best min-loss so far."""
        floor = self.best_loss if loss is None else min(self.best_loss, loss)
        self.ctx.report(
            phase / self.phases,
            candidates=len(self.candidates),
            loss=floor if np.isfinite(floor) else None,
        )

    def source_progress(self, position: int) -> Any:
        """A progress callback for a source running as phase ``position``."""
        if self.ctx.progress is None:
            return None

        def progress(fraction: float, info: dict[str, Any]) -> None:
            reported = info.get("best_loss")
            self.report(
                position + min(max(fraction, 0.0), 1.0),
                None if reported is None else float(reported) / self.ctx.loss_scale,
            )

        return progress

    def polish(
        self,
        on: FitContext,
        source: str | list[str],
        starts: FloatArray,
        seconds: float,
        phase: float,
        *,
        tol: float | None = None,
        keep: int | None = None,
    ) -> None:
        """Polish ``starts`` by classical AM on ``on``'s rows and record them.

        ``source`` names the source of every start, or of each. The polish runs to ``tol`` (by
        default the fit's). With ``keep``, every start first runs :data:`SCREEN_ITERATIONS`
        iterations and only the ``keep`` lowest of each source go on: the others are recorded
        as they are.
        """
        n_starts = starts.shape[0]
        sources = [source] * n_starts if isinstance(source, str) else source
        tol = on.params["tol"] if tol is None else tol
        max_iter = on.params["max_iter"]
        started = time.monotonic()

        def run(lines: FloatArray, iterations: int) -> BatchResult:
            if on.streamed is not None:
                return on.streamed.polish(
                    lines,
                    max_iter=iterations,
                    tol=tol,
                    deadline=on.deadline,
                    callback=lambda iteration, loss: self.report(phase, loss),
                )
            return classic_am_batch(
                on.Z,
                on.y,
                lines,
                max_iter=iterations,
                tol=tol,
                deadline=on.deadline,
                callback=lambda iteration, loss: self.report(phase, loss),
                sample_weight=on.sample_weight,
                grouping=on.grouping,
                solver=on.least_squares,
            )

        screened = keep is not None and keep < n_starts and max_iter > SCREEN_ITERATIONS
        batch = run(starts, SCREEN_ITERATIONS if screened else max_iter)
        if screened:
            # The best of each source go on: moves that start far from a good line set
            # (a fresh line) need more iterations to show their worth than the others.
            names = np.array(sources)
            ranked = np.concatenate(
                [
                    np.flatnonzero(names == name)[
                        np.argsort(batch.losses[names == name], kind="stable")[:keep]
                    ]
                    for name in dict.fromkeys(sources)
                ]
            )
            going_on = np.sort(ranked[~batch.converged[ranked]])
            rest = run(batch.thetas[going_on], max_iter - SCREEN_ITERATIONS)
            batch.thetas[going_on] = rest.thetas
            batch.n_iter[going_on] += rest.n_iter
            batch.converged[going_on] = rest.converged
            for position, index in enumerate(going_on):
                batch.loss_histories[index] += rest.loss_histories[position][1:]
        share = (seconds + time.monotonic() - started) / n_starts
        n_rows, n_params = on.n_rows, on.Z.shape[1]
        iterations = float(np.sum(batch.n_iter + 1))
        self.work += iterations * n_rows * n_params * (n_params + on.n_components)
        for index, history in enumerate(batch.loss_histories):
            self.candidates.append(
                Candidate(
                    source=sources[index],
                    min_loss_before=history[0],
                    min_loss_after=history[-1],
                    seconds=share,
                    n_iter=int(batch.n_iter[index]),
                    converged=bool(batch.converged[index]),
                    n_rows=n_rows,
                )
            )
        self.polished += list(batch.thetas)
        self.histories += batch.loss_histories
        self.best_loss = min(self.best_loss, float(batch.losses.min()))

    def result(self, among: range) -> AutoResult:
        """The candidate of lowest min-loss among the indices ``among``."""
        winner = among[int(np.argmin([self.candidates[i].min_loss_after for i in among]))]
        chosen = self.candidates[winner]
        return AutoResult(
            theta=self.polished[winner],
            loss_history=self.histories[winner],
            n_iter=chosen.n_iter,
            converged=chosen.converged,
            n_candidates=len(self.candidates),
            candidates=self.candidates,
        )


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def default_search_work(n_rows: int, n_params: int, n_components: int) -> float:
    """Work after which ``auto`` stops its rounds of moves and restarts (no time budget).

    Counted in multiply-adds of the polish (each iteration of each start: ``n_rows *
    n_params * (n_params + n_components)``), so the point where it stops depends on the seed
    only, never on the machine's speed or load. It is the work of :data:`MIN_CAP_SECONDS`
    plus :data:`CAP_SECONDS_PER_WORK` seconds per row, parameter and line searched, at most
    :data:`MAX_CAP_SECONDS`, at :data:`WORK_PER_SECOND` (one core of a typical machine). The
    rounds usually stop well before, when they stop improving; the cap bounds the cost on
    data where they keep improving a little.

    Parameters
    ----------
    n_rows : int
        Rows the search runs on (the sample on large data).
    n_params : int
        Features, plus one when an intercept is fitted.
    n_components : int

    Returns
    -------
    float
    """
    seconds = min(
        MAX_CAP_SECONDS, MIN_CAP_SECONDS + CAP_SECONDS_PER_WORK * n_rows * n_params * n_components
    )
    return float(seconds * WORK_PER_SECOND)


def fit_auto(ctx: FitContext) -> AutoResult:
    """Run every source, search around the best, restart while it pays, polish the best.

    See the module docstring.
    """
    n_samples = ctx.n_rows
    sample = ctx
    on_all_rows = n_samples <= SEARCH_ROWS
    if ctx.streamed is not None:
        # Streamed rows: the search sample is gathered from the chunks (all rows when few).
        rows = np.arange(n_samples) if on_all_rows else _search_rows(ctx)
        Z, y, sample_weight = ctx.streamed.gather(rows)
        sample = replace(ctx, Z=Z, y=y, sample_weight=sample_weight, streamed=None)
    elif not on_all_rows:
        rows = _search_rows(ctx)
        sample = replace(
            ctx,
            Z=ctx.Z[rows],
            y=ctx.y[rows],
            sample_weight=None if ctx.sample_weight is None else ctx.sample_weight[rows],
            grouping=None if ctx.grouping is None else ctx.grouping.subset(rows),
        )
    if ctx.n_components == 1:
        # One line: least squares on all rows is the exact minimum of the min-loss.
        search = _Search(ctx, 1)
        started = time.monotonic()
        if ctx.streamed is not None and ctx.params.get("init") is None:
            # The one part of a random partition into one part: all rows.
            line = ctx.streamed.least_squares()[None, None]
        else:
            line = starting_lines(ctx, random_partition_lines, 1)
        search.polish(ctx, "least squares", line, time.monotonic() - started, 1)
        return search.result(range(1))
    # A time budget bounds the rounds by time alone; without one, the work cap bounds them.
    work_cap = np.inf
    if ctx.deadline is None:
        work_cap = default_search_work(sample.Z.shape[0], sample.Z.shape[1], ctx.n_components)
    given = ctx.params.get("init")
    # The random sources draw their own starts; given lines (a warm start, or a k sweep's
    # (k - 1)-line fit plus one line) are one more candidate, the first.
    if given is not None:
        sample = replace(sample, params={**sample.params, "init": None})
    sources = _sources(ctx)
    if given is not None:
        sources.insert(0, ("init", lambda c: np.asarray(given, dtype=np.float64)[None]))
    em_restart = None
    # One row per group is the ungrouped search (the same lines).
    if ctx.grouping is not None and ctx.grouping.n_groups < n_samples:
        # The grouped EM starts come first and stand in for the EM source (and the given
        # lines, polished with them).
        sources = [(name, make) for name, make in sources if name not in ("em", "init")]
        search = _Search(ctx, len(sources) + 3)
        em_restart = _grouped_em_starts(search, sample, given)
        if not on_all_rows:
            # Its likelihood is the sample's: not comparable with a fit on all rows.
            em_restart = None
        if _starts_agree(search) or _past(ctx.deadline):
            if on_all_rows:
                result = search.result(range(len(search.candidates)))
            else:
                result = _polish_finalists(search, sample, given)
            result.em_restart = em_restart
            return result
    else:
        # The rounds of moves and restarts, and the final polish, are phases of their own.
        search = _Search(ctx, len(sources) + 2)
    first_phase = search.phases - len(sources) - 2
    for position, (source, make_starts) in enumerate(sources):
        if position > 0 and _past(ctx.deadline):
            break
        started = time.monotonic()
        starts = make_starts(
            replace(sample, progress=search.source_progress(first_phase + position))
        )
        search.polish(
            sample,
            source,
            starts,
            time.monotonic() - started,
            first_phase + position + 1,
            tol=EXPLORE_TOL,
            keep=SURVIVORS,
        )
    rounds = _Rounds(search, sample, work_cap, search.phases - 2)
    rounds.improve(first=0)
    rounds.restart_while_improving()
    result = _polish_finalists(search, sample, None if on_all_rows else given)
    result.em_restart = em_restart
    return result


def _grouped_em_starts(search: _Search, sample: FitContext, given: FloatArray | None) -> EMResult:
    """Grouped EM from ``n_init`` random partitions of the groups (:data:`MAX_EM_RESTARTS` at
    most), every fit (and the given lines, first) polished by grouped classical AM to the
    fit's ``tol``; returns the EM fit of highest final likelihood (the first of equals, as
    ``algorithm="em"`` keeps)."""
    started = time.monotonic()
    starts = random_partition_lines(sample, min(sample.params["n_init"], MAX_EM_RESTARTS))
    batch = em_batch(
        sample.Z,
        sample.y,
        starts,
        max_iter=EM_MAX_ITER,
        tol=EM_TOL,
        deadline=sample.deadline,
        callback=lambda iteration, loss: search.report(iteration / EM_MAX_ITER, loss),
        sample_weight=sample.sample_weight,
        grouping=sample.grouping,
        solver=sample.least_squares,
    )
    polished, sources = batch.thetas, ["em"] * starts.shape[0]
    if given is not None:
        polished = np.concatenate([np.asarray(given, dtype=np.float64)[None], polished])
        sources = ["init", *sources]
    search.polish(sample, sources, polished, time.monotonic() - started, 1)
    return batch.start(int(np.argmax([ll[-1] for ll in batch.log_likelihood_histories])))


def _starts_agree(search: _Search) -> bool:
    """Whether :data:`AGREEING_SHARE` of the candidates (two at least) reached the best
    min-loss."""
    losses = np.array([candidate.min_loss_after for candidate in search.candidates])
    best = losses.min()
    needed = max(2, int(np.ceil(AGREEING_SHARE * losses.size)))
    return int(np.sum(losses <= best + SAME_MIN_LOSS * abs(best))) >= needed


def _search_rows(ctx: FitContext) -> NDArray[np.intp]:
    """The rows of the search sample: :data:`SEARCH_ROWS` drawn uniformly without
    replacement (each keeps its weight), or with groups, whole groups drawn in random order
    until the next would pass :data:`SEARCH_ROWS` rows (at least one)."""
    n_samples = ctx.n_rows
    if ctx.grouping is None:
        return np.sort(ctx.rng.choice(n_samples, size=SEARCH_ROWS, replace=False))
    sizes = np.bincount(ctx.grouping.codes, minlength=ctx.grouping.n_groups)
    order = ctx.rng.permutation(ctx.grouping.n_groups)
    taken = np.cumsum(sizes[order]) <= SEARCH_ROWS
    taken[0] = True
    chosen = np.zeros(ctx.grouping.n_groups, dtype=bool)
    chosen[order[taken]] = True
    return np.flatnonzero(chosen[ctx.grouping.codes])


class _Rounds:
    """Rounds of moves around the best candidate, and restarts, under a patience rule."""

    def __init__(self, search: _Search, sample: FitContext, work_cap: float, phase: int) -> None:
        self.search, self.sample, self.work_cap, self.phase = search, sample, work_cap, phase
        self.started_work = search.work
        self.cap_factor = 1.0
        """:data:`DISAGREEMENT_CAP_FACTOR` once the batches disagree (:func:`_batches_agree`)."""

    def _progress_phase(self) -> float:
        """Progress through the rounds: the share of the work cap, or of the time budget."""
        done = (self.search.work - self.started_work) / self.work_cap
        return self.phase + min(1.0, done)

    def over(self) -> bool:
        """Whether the time budget has passed or the work cap (times :attr:`cap_factor`) is
        spent."""
        return _past(self.sample.deadline) or self.search.work >= self.work_cap * self.cap_factor

    def _random_starts(self, count: int) -> list[tuple[str, FloatArray]]:
        partitions = count - count // 2
        groups = [
            ("random partition", starting_lines(self.sample, random_partition_lines, partitions))
        ]
        if count // 2:
            groups.append(
                ("random rows", starting_lines(self.sample, random_rows_lines, count // 2))
            )
        return groups

    def _polish(self, groups: list[tuple[str, FloatArray]], seconds: float) -> None:
        self.search.polish(
            self.sample,
            [source for source, starts in groups for _ in range(starts.shape[0])],
            np.concatenate([starts for _, starts in groups]),
            seconds,
            self._progress_phase(),
            tol=EXPLORE_TOL,
            keep=SURVIVORS,
        )

    def improve(self, first: int) -> None:
        """Rounds of moves from the best of the candidates from index ``first`` on.

        Each round polishes, as one batch, line sets made from the best of these candidates:
        a line that fits its rows badly split in two with a slot freed elsewhere
        (:func:`split_and_free`, from the best candidate not yet split), a line moved to
        where the others fit worst (:func:`reseed_by_residual`), and a line replaced by the
        line of a few random rows. The rounds stop after :data:`PATIENCE` in a row that
        improved the best by a relative :data:`IMPROVEMENT` or less, or at the cap.
        """
        search, sample = self.search, self.sample
        split_from: list[FloatArray] = []
        stale = 0
        while stale < PATIENCE and not self.over():
            started = time.monotonic()
            losses = np.array([c.min_loss_after for c in search.candidates[first:]])
            order = first + np.argsort(losses, kind="stable")
            best = search.polished[order[0]]
            before = float(losses.min())
            groups: list[tuple[str, FloatArray]] = []
            base = next(
                (
                    search.polished[index]
                    for index in order
                    if not any(np.allclose(search.polished[index], seen) for seen in split_from)
                ),
                None,
            )
            if base is not None:
                split_from.append(base)
                groups.append(
                    (
                        "split and free",
                        split_and_free(
                            sample.Z, sample.y, base, SPLITS, sample.sample_weight, sample.grouping
                        ),
                    )
                )
            groups.append(
                (
                    "reseed by residual",
                    reseed_by_residual(
                        sample.Z,
                        sample.y,
                        best,
                        RESEEDS,
                        sample.rng,
                        sample.sample_weight,
                        sample.grouping,
                    ),
                )
            )
            replaced = np.repeat(best[None], REPLACEMENTS, axis=0)
            which = sample.rng.integers(0, sample.n_components, size=REPLACEMENTS)
            replaced[np.arange(REPLACEMENTS), which] = lines_of_random_rows(sample, REPLACEMENTS)
            groups.append(("replace a line", replaced))
            self._polish(groups, time.monotonic() - started)
            after = min(c.min_loss_after for c in search.candidates[first:])
            improvement = (before - after) / max(before, np.finfo(np.float64).tiny)
            stale = 0 if improvement > IMPROVEMENT else stale + 1

    def restart_while_improving(self) -> None:
        """Fresh random starts, each batch searched around by :meth:`improve`, while they
        improve the best; stops after :data:`RESTART_PATIENCE` batches in a row that did not,
        or at the cap.

        Unless the batches agree (:func:`_batches_agree`: the best was reached by two of
        them, the sources' phase counting as one): then up to :data:`DISAGREEMENT_BATCHES`
        more batches run, under the cap times :data:`DISAGREEMENT_CAP_FACTOR`, until they
        do. On data with many nearly equal minima a best found once is seldom the best there
        is; on data with one clear minimum the first batch finds it again and nothing changes.
        """
        stale = extra = 0
        bests = [self.search.best_loss]
        while not self.over():
            if stale >= RESTART_PATIENCE:
                if _batches_agree(bests) or extra >= DISAGREEMENT_BATCHES:
                    break
                extra += 1
            if not _batches_agree(bests):
                self.cap_factor = DISAGREEMENT_CAP_FACTOR
            before = self.search.best_loss
            first = len(self.search.candidates)
            started = time.monotonic()
            groups = self._random_starts(int(np.clip(self.sample.params["n_init"], 2, RESTARTS)))
            self._polish(groups, time.monotonic() - started)
            self.improve(first)
            bests.append(min(c.min_loss_after for c in self.search.candidates[first:]))
            improvement = (before - self.search.best_loss) / max(before, np.finfo(np.float64).tiny)
            stale = 0 if improvement > IMPROVEMENT else stale + 1


def _batches_agree(bests: list[float]) -> bool:
    """Whether at least two of the batches' best min-losses are within a relative
    :data:`AGREEMENT` of the lowest (a single batch agrees with itself only when there is
    nothing else to go on: one batch is not a disagreement)."""
    if len(bests) < 2:
        return True
    values = np.array(bests)
    lowest = values.min()
    return int(np.sum(values <= lowest + AGREEMENT * abs(lowest))) >= 2


def _finalists(search: _Search, sample: FitContext) -> list[int]:
    """The candidates worth polishing on all rows: the best, and the distinct ones whose
    sample min-loss is within :data:`TRUSTED_GAP` standard errors of it.

    Two line sets compared on the same sample differ by the mean of the rows' differences of
    squared residuals; its standard error says how far the sample's ranking can be trusted.
    At least :data:`MIN_FINALISTS` (when there are that many distinct candidates) and at most
    :data:`MAX_FINALISTS` are kept.
    """
    order = np.argsort([c.min_loss_after for c in search.candidates], kind="stable")
    distinct: list[int] = []
    for index in order:
        if len(distinct) == MAX_FINALISTS:
            break
        if not any(np.allclose(search.polished[index], search.polished[i]) for i in distinct):
            distinct.append(int(index))
    squared, _ = assign_many(
        sample.Z,
        sample.y,
        np.stack([search.polished[i] for i in distinct]),
        sample_weight=sample.sample_weight,
        grouping=sample.grouping,
    )
    # The units compared are rows, or groups (each its weighted sum of squared residuals).
    if sample.sample_weight is not None:
        squared = squared * sample.sample_weight
    if sample.grouping is not None:
        squared = sample.grouping.sum(squared)
    differences = squared[1:] - squared[0]
    standard_errors = differences.std(axis=1) / np.sqrt(squared.shape[1])
    within = differences.mean(axis=1) <= TRUSTED_GAP * standard_errors
    keep = np.concatenate([[True], within])
    keep[:MIN_FINALISTS] = True
    return [index for index, kept in zip(distinct, keep, strict=True) if kept]


def _polish_finalists(
    search: _Search, sample: FitContext, given: FloatArray | None = None
) -> AutoResult:
    """Polish the finalists (:func:`_finalists`) on all rows to the fit's ``tol``; the best
    wins.

    Given lines (a warm start) are polished on all rows too, whatever their rank on the
    sample: classical AM never raises the min-loss, so the fit ends no worse than its start.
    """
    if _past(search.ctx.deadline):
        # Out of time: the best so far only, evaluated (not polished) on all rows.
        chosen = [int(np.argmin([c.min_loss_after for c in search.candidates]))]
    else:
        chosen = _finalists(search, sample)
    first = len(search.candidates)
    sources = [search.candidates[index].source for index in chosen]
    starts = [search.polished[index] for index in chosen]
    if given is not None:
        sources.append("init")
        starts.append(np.asarray(given, dtype=np.float64))
    search.polish(search.ctx, sources, np.stack(starts), 0.0, search.phases)
    return search.result(range(first, len(search.candidates)))
