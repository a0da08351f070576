"""``algorithm="auto"``: candidates from every source, each polished by classical AM; the best wins.

The min-loss is NP-hard to minimize and every algorithm of the paper is a heuristic that
sometimes lands in a poor local minimum. Classical AM (assign each row to its best line, refit
each line by least squares) never increases the min-loss, so any set of lines it starts from
ends at least as good as it began. The search therefore collects starting line sets from
several sources that fail in different ways — random restarts, the paper's A3 (Algorithm 3
with least squares, then Algorithm 1), Algorithm 3 with RANSAC, and EM restarts — polishes
every one of them to a fixed point of classical AM, then searches around the best by replacing
one of its lines at a time, and keeps the lowest training min-loss.

On many rows the sources run on a uniform sample of :data:`SEARCH_ROWS` rows; the best few
polished candidates are then polished again on all rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._am import SolverResult, classic_am_batch
from ._em import em_batch
from ._lstsq import lstsq_weighted_subsets
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
FINALISTS = 3
"""Polished candidates of the sample that are polished again on all rows."""
MIN_N_INIT, MAX_N_INIT = 4, 100
# Work (multiply-adds of the batched refit, summed over the random starts' iterations) that
# the size-aware default of n_init aims at: a few tenths of a second on one core.
_RANDOM_START_WORK = 1e9
_TYPICAL_POLISH_ITERATIONS = 30
# EM restarts run beside the random starts: as R's flexmix and mixtools users do, 10 at most.
MAX_EM_RESTARTS = 10
# Local search around the best: n_init // 5 starts per round, at most n_init // 10 rounds.
REPLACEMENTS_PER_ROUND_SHARE = 5
ROUNDS_SHARE = 10
# Rounds stop after this many in a row that did not improve the best.
PATIENCE = 2
# EM's own defaults (those of algorithm="em").
EM_MAX_ITER, EM_TOL = 200, 1e-6
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
    membership = np.zeros((count, n_samples))
    for line in range(count):
        membership[line, ctx.rng.choice(n_samples, size=size, replace=False)] = 1.0
    theta: FloatArray = lstsq_weighted_subsets(ctx.Z, ctx.y, membership)
    return theta


def random_rows_lines(ctx: FitContext) -> FloatArray:
    """A starting line set: every line fitted on its own small random set of rows."""
    return lines_of_random_rows(ctx, ctx.n_components)


StartingLines = Callable[[FitContext], FloatArray]
"""A source: a function of the (sample's) fit context that returns starting line sets."""


def _sources(ctx: FitContext) -> list[tuple[str, StartingLines]]:
    """Each source's name and the function that returns its starting lines.

    A source with no starts to give (``n_init=1`` leaves no "random rows" start) is left out.
    Given ``init`` lines (a warm start) are the first candidate; the other sources draw their
    own starts regardless.
    """
    p = ctx.params
    n_random = p["n_init"]
    iterations = {"max_iter": p["max_iter"], "tol": p["tol"]}
    search = {"subsample_size": p["subsample_size"], "n_partitions": p["n_partitions"]}

    def drawn(c: FitContext) -> FitContext:
        # ``starting_lines`` returns the given ``init`` instead of drawing, as am and em want.
        return replace(c, params={**c.params, "init": None})

    def random_starts(kind: StartingLines, count: int) -> StartingLines:
        return lambda c: starting_lines(drawn(c), kind, count)

    def warm_start(c: FitContext) -> FloatArray:
        return np.asarray(c.params["init"], dtype=np.float64)[None]

    def a3(c: FitContext) -> FloatArray:
        sub = replace(c, params={**search, **iterations, "base": "ls", "step_size": "auto"})
        return fit_subsample_am(sub).theta[None]

    def ransac(c: FitContext) -> FloatArray:
        partitions = max(1, p["n_partitions"] // _RANSAC_PARTITION_SHARE)
        sub = replace(c, params={**search, "n_partitions": partitions, "base": "ransac"})
        return fit_subsample(sub).theta[None]

    def em_starts(c: FitContext) -> FloatArray:
        starts = starting_lines(drawn(c), random_partition_lines, em_restarts(n_random))
        return em_batch(
            c.Z,
            c.y,
            starts,
            max_iter=EM_MAX_ITER,
            tol=EM_TOL,
            deadline=c.deadline,
            callback=lambda iteration, loss: c.report(iteration / EM_MAX_ITER, loss=loss),
        ).thetas

    sources: list[tuple[str, StartingLines]] = []
    if p.get("init") is not None:
        sources.append(("init", warm_start))
    sources.append(
        ("random partition", random_starts(random_partition_lines, n_random - n_random // 2))
    )
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
        self, on: FitContext, source: str, starts: FloatArray, seconds: float, phase: float
    ) -> None:
        """Polish ``starts`` by classical AM on ``on``'s rows and record them."""
        started = time.monotonic()
        batch = classic_am_batch(
            on.Z,
            on.y,
            starts,
            max_iter=on.params["max_iter"],
            tol=on.params["tol"],
            deadline=on.deadline,
            callback=lambda iteration, loss: self.report(phase, loss),
        )
        share = (seconds + time.monotonic() - started) / starts.shape[0]
        for index, history in enumerate(batch.loss_histories):
            self.candidates.append(
                Candidate(
                    source=source,
                    min_loss_before=history[0],
                    min_loss_after=history[-1],
                    seconds=share,
                    n_iter=int(batch.n_iter[index]),
                    converged=bool(batch.converged[index]),
                    n_rows=on.Z.shape[0],
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


def fit_auto(ctx: FitContext) -> AutoResult:
    """Run every source, polish every candidate, return the best (see the module docstring)."""
    n_samples = ctx.Z.shape[0]
    sample = ctx
    if n_samples > SEARCH_ROWS:
        rows = np.sort(ctx.rng.choice(n_samples, size=SEARCH_ROWS, replace=False))
        sample = replace(ctx, Z=ctx.Z[rows], y=ctx.y[rows])
    if ctx.n_components == 1:
        # One line: least squares on all rows is the exact minimum of the min-loss.
        search = _Search(ctx, 1)
        started = time.monotonic()
        line = starting_lines(ctx, random_partition_lines, 1)
        search.polish(ctx, "least squares", line, time.monotonic() - started, 1)
        return search.result(range(1))
    sources = _sources(ctx)
    # Replacing lines of the best, and the final polish on all rows, are phases of their own.
    search = _Search(ctx, len(sources) + 1 + (sample is not ctx))
    for position, (source, make_starts) in enumerate(sources):
        if position > 0 and _past(ctx.deadline):
            break
        started = time.monotonic()
        starts = make_starts(replace(sample, progress=search.source_progress(position)))
        search.polish(sample, source, starts, time.monotonic() - started, position + 1)
    _replace_lines_of_the_best(search, sample, len(sources))
    if sample is ctx:
        return search.result(range(len(search.candidates)))
    return _polish_finalists(search)


def _replace_lines_of_the_best(search: _Search, sample: FitContext, phase: int) -> None:
    """Local search around the best candidate: swap one of its lines for a fresh one, polish.

    Each round polishes ``n_init // 5`` copies of the best line set so far, each with one line
    (chosen at random) replaced by the least-squares line of a small random set of rows. A
    poor local minimum of classical AM usually has one misplaced line; the others are worth
    keeping. Rounds stop after two in a row that do not improve the best, or after
    ``n_init // 10`` rounds.
    """
    n_init, n_components = sample.params["n_init"], sample.n_components
    per_round = max(2, n_init // REPLACEMENTS_PER_ROUND_SHARE)
    rounds = max(1, n_init // ROUNDS_SHARE)
    stale = 0
    for round_number in range(rounds):
        if _past(sample.deadline):
            return
        started = time.monotonic()
        best = search.polished[int(np.argmin([c.min_loss_after for c in search.candidates]))]
        starts = np.repeat(best[None], per_round, axis=0)
        replaced = sample.rng.integers(0, n_components, size=per_round)
        starts[np.arange(per_round), replaced] = lines_of_random_rows(sample, per_round)
        before = search.best_loss
        search.polish(
            sample,
            "replace a line",
            starts,
            time.monotonic() - started,
            phase + (round_number + 1) / rounds,
        )
        stale = 0 if search.best_loss < before else stale + 1
        if stale == PATIENCE:
            return


def _polish_finalists(search: _Search) -> AutoResult:
    """Polish the best few distinct candidates of the sample on all rows; the best wins."""
    chosen: list[int] = []
    losses = [candidate.min_loss_after for candidate in search.candidates]
    for index in np.argsort(losses, kind="stable"):
        if len(chosen) == FINALISTS:
            break
        if not any(np.allclose(search.polished[index], search.polished[i]) for i in chosen):
            chosen.append(int(index))
    first = len(search.candidates)
    for rank, index in enumerate(chosen):
        if rank > 0 and _past(search.ctx.deadline):
            break
        search.polish(
            search.ctx,
            search.candidates[index].source,
            search.polished[index][None],
            0.0,
            search.phases - 1 + (rank + 1) / len(chosen),
        )
    return search.result(range(first, len(search.candidates)))
