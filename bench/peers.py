"""mixreg side by side with the R packages flexmix and mixtools.

Run ``python -m bench.peers`` (``make bench-peers``; ``make bench`` runs it after
``bench.algorithms``). It needs ``Rscript`` with the R packages flexmix, mixtools and MASS; when
they are missing it prints why and exits without writing anything. It writes its own section of
``bench/RESULTS.md``, between the lines ``<!-- peers:start -->`` and ``<!-- peers:end -->``
(appended at the end when the markers are missing), and leaves the rest of the file alone.

For every data set and number of lines k, with seeds 0..4:

- flexmix: ``stepFlexmix(y ~ ., k = k, nrep = 10)``, which keeps the best of 10 random starts
  by log-likelihood;
- mixtools: 10 calls of ``regmixEM(y, X, k = k)``, keeping the best log-likelihood; a start
  that raises an error is counted and skipped, and the starts of one seed share a wall-time
  budget (``regmixEM``'s E-step is an interpreted loop over the rows, minutes per start on a few
  thousand rows);
- every algorithm of ``mixreg.ALGORITHMS`` with its defaults and ``random_state = seed``;
- the one-line least-squares fit, as a yardstick;
- for k = 2 on one feature, the line-pair search (``bench.line_pairs``): every pair of lines
  through two training points scored, the best pairs polished by classical AM; run when it
  costs at most ``MAX_LINE_PAIR_EVALUATIONS`` row evaluations.

The lowest training min-loss reached by any of these (any seed) is the case's *best known*
min-loss, the yardstick for how far the criterion's reference, the better R package, is from
what can be reached.

R fits on the training rows written to a CSV file and hands back each component's intercept
and slopes; the min-loss of every method's lines, on the training and on the test rows, is then
computed here by one function (``bench.reference.reference_min_loss``).

Every seed's min-losses, times and notes are saved to ``bench/peers_runs.json`` (``--runs``);
``python -m bench.peers --summary-only`` rebuilds the section from that file in a second,
without R and without fitting anything.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as dt
import inspect
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import mixreg
from bench.line_pairs import (
    N_POLISHED,
    POLISH_MAX_ITER,
    candidate_lines,
    line_pair_search,
    pair_cost,
)
from bench.real_data import (
    R_DATASETS,
    R_SCRIPTS,
    DataUnavailableError,
    RealData,
    export_r_datasets,
    load_diabetes_data,
    load_r_dataset,
    movielens_two_users,
    split_train_test,
)
from bench.reference import reference_least_squares, reference_min_loss, reference_predict
from bench.sections import load_average, log, machine_lines, write_section
from mixreg.datasets import make_friedman, make_two_regressions

FloatArray = NDArray[np.float64]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
DEFAULT_RUNS = REPO_ROOT / "bench" / "peers_runs.json"
RUNS_FORMAT = 1
SECTION = "peers"
DATA_SEED = 0
R_PACKAGES = ("flexmix", "mixtools", "MASS")
R_METHODS = ("flexmix", "mixtools")
LEAST_SQUARES = "least squares (one line)"
LINE_PAIR = "line-pair search + classical AM (k = 2, one feature)"
ACCEPTANCE_RATIO = 0.99
# Relative gap below which a min-loss counts as equal to the best known one.
SAME_LOSS_RTOL = 1e-6
# The line-pair search is run when scoring all its pairs costs at most this many row
# evaluations: about 30 s for Old Faithful's 218 training rows (4.4e10) on a 2-core machine.
MAX_LINE_PAIR_EVALUATIONS = 5e10


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run."""

    n_seeds: int
    n_starts: int
    mixtools_budget_seconds: float


FULL = Settings(n_seeds=5, n_starts=10, mixtools_budget_seconds=60.0)
QUICK = Settings(n_seeds=2, n_starts=3, mixtools_budget_seconds=5.0)


@dataclass(frozen=True)
class CaseInfo:
    """What the report says about a case: the data set, its row counts and k."""

    title: str
    source: str
    target: str
    features: tuple[str, ...]
    n_components: int
    n_train: int
    n_test: int

    @property
    def name(self) -> str:
        """Title and k, e.g. ``"Old Faithful, k = 2"``."""
        return f"{self.title}, k = {self.n_components}"


@dataclass(frozen=True)
class Case:
    """One data set, split into training and test rows, and the number of lines to fit."""

    title: str
    source: str
    target: str
    features: tuple[str, ...]
    n_components: int
    X_train: FloatArray
    y_train: FloatArray
    X_test: FloatArray
    y_test: FloatArray

    @property
    def name(self) -> str:
        """Title and k, e.g. ``"Old Faithful, k = 2"``."""
        return f"{self.title}, k = {self.n_components}"

    def info(self) -> CaseInfo:
        """The case without its rows."""
        return CaseInfo(
            title=self.title,
            source=self.source,
            target=self.target,
            features=self.features,
            n_components=self.n_components,
            n_train=len(self.y_train),
            n_test=len(self.y_test),
        )


@dataclass(frozen=True)
class Lines:
    """Fitted lines: ``coef`` of shape (n_lines, n_features), ``intercept`` of shape (n_lines,)."""

    coef: FloatArray
    intercept: FloatArray


@dataclass(frozen=True)
class PeerFit:
    """One seed's fit by an R package, as read from the R script's output.

    ``counts`` holds the R script's tallies: starts_done, starts_failed, starts_timed_out,
    starts_not_converged and internal_restarts.
    """

    package: str
    seed: int
    lines: Lines | None
    seconds: float
    loglik: float
    counts: dict[str, int]
    message: str = ""


@dataclass
class MethodRuns:
    """Every seed's outcome of one method on one case."""

    method: str
    train_losses: list[float] = field(default_factory=list)
    test_losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    n_failed: int = 0
    note: str = ""

    def add(self, case: Case, lines: Lines | None, seconds: float) -> None:
        """Score one seed's lines (``None``: the fit produced none) on both sets of rows."""
        self.seconds.append(seconds)
        if lines is None:
            self.n_failed += 1
            return
        self.train_losses.append(lines_min_loss(lines, case.X_train, case.y_train))
        self.test_losses.append(lines_min_loss(lines, case.X_test, case.y_test))

    @property
    def train_mean(self) -> float:
        """Mean training min-loss over the seeds that produced lines (NaN if none did)."""
        return float(np.mean(self.train_losses)) if self.train_losses else math.nan

    @property
    def test_mean(self) -> float:
        """Mean test min-loss over the seeds that produced lines (NaN if none did)."""
        return float(np.mean(self.test_losses)) if self.test_losses else math.nan


@dataclass(frozen=True)
class CaseResult:
    """The runs of every method on one case."""

    case: CaseInfo
    runs: list[MethodRuns]

    def run(self, method: str) -> MethodRuns | None:
        """The runs of ``method``, if it was run on this case."""
        return next((run for run in self.runs if run.method == method), None)

    def best_known_train(self) -> float:
        """The lowest training min-loss of any method and seed (NaN if none fitted)."""
        losses = [loss for run in self.runs for loss in run.train_losses if math.isfinite(loss)]
        return min(losses) if losses else math.nan

    def reached_best_known(self) -> list[str]:
        """Methods whose best seed is within ``SAME_LOSS_RTOL`` of the best known min-loss."""
        best = self.best_known_train()
        return [
            run.method
            for run in self.runs
            if run.train_losses and same_loss(min(run.train_losses), best)
        ]

    def better_r_method(self) -> str | None:
        """flexmix or mixtools, whichever has the lower mean training min-loss."""
        candidates = [
            run for run in self.runs if run.method in R_METHODS and math.isfinite(run.train_mean)
        ]
        return min(candidates, key=lambda run: run.train_mean).method if candidates else None

    def best_r_train(self) -> float:
        """The lower mean training min-loss of flexmix and mixtools (NaN if neither fitted)."""
        losses = [run.train_mean for run in self.runs if run.method in R_METHODS]
        finite = [loss for loss in losses if math.isfinite(loss)]
        return min(finite) if finite else math.nan

    def best_r_test(self) -> float:
        """Test min-loss of the R package with the lower training min-loss."""
        candidates = [
            run for run in self.runs if run.method in R_METHODS and math.isfinite(run.train_mean)
        ]
        return min(candidates, key=lambda run: run.train_mean).test_mean if candidates else math.nan


# --------------------------------------------------------------------------- scoring


def lines_min_loss(lines: Lines, X: FloatArray, y: FloatArray) -> float:
    """The paper's min-loss of ``lines`` on (X, y): the same function for every method."""
    return reference_min_loss(y, reference_predict(X, lines.coef, lines.intercept))


def same_loss(value: float, reference: float) -> bool:
    """Whether two min-losses agree within a relative ``SAME_LOSS_RTOL``."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return False
    return abs(value - reference) <= SAME_LOSS_RTOL * max(abs(reference), abs(value))


def ratio(value: float, reference: float) -> float:
    """``value / reference``, NaN when either is missing or the reference is not positive."""
    if not (math.isfinite(value) and math.isfinite(reference)) or reference <= 0:
        return math.nan
    return value / reference


# --------------------------------------------------------------------------- data


def paper_cases() -> list[Case]:
    """The paper's four data sets (k = 2), drawn once with seed 0, with their own split."""
    cases = []
    for variant in (1, 2, 3):
        X_train, y_train, X_test, y_test = make_friedman(variant, random_state=DATA_SEED)
        n_features = X_train.shape[1]
        cases.append(
            Case(
                title=f"Friedman {variant}",
                source=f"`mixreg.datasets.make_friedman({variant}, random_state={DATA_SEED})`",
                target="y",
                features=tuple(f"x{index + 1}" for index in range(n_features)),
                n_components=2,
                X_train=X_train,
                y_train=y_train,
                X_test=X_test,
                y_test=y_test,
            )
        )
    X_train, y_train, X_test, y_test = make_two_regressions(random_state=DATA_SEED)[:4]
    cases.append(
        Case(
            title="Mixture of two regressions",
            source=f"`mixreg.datasets.make_two_regressions(random_state={DATA_SEED})`",
            target="y",
            features=tuple(f"x{index + 1}" for index in range(X_train.shape[1])),
            n_components=2,
            X_train=X_train,
            y_train=y_train,
            X_test=X_test,
            y_test=y_test,
        )
    )
    return cases


def real_cases(data: RealData, source: str | None = None) -> list[Case]:
    """One case per k of the data set, all on the same seeded 80/20 split."""
    X_train, y_train, X_test, y_test = split_train_test(data.X, data.y)
    spec = data.spec
    return [
        Case(
            title=spec.title,
            source=source or spec.source,
            target=spec.target,
            features=spec.features,
            n_components=k,
            X_train=X_train,
            y_train=y_train,
            X_test=X_test,
            y_test=y_test,
        )
        for k in spec.n_components
    ]


def all_cases(skipped: list[str]) -> list[Case]:
    """The paper's data sets and the real ones; a real one that cannot be read is skipped.

    Parameters
    ----------
    skipped : list of str
        Receives one line per data set left out, with the reason.
    """
    cases = paper_cases()
    try:
        export_r_datasets(R_DATASETS)
        for spec in R_DATASETS:
            cases.extend(real_cases(load_r_dataset(spec)))
    except DataUnavailableError as error:
        skipped.append(f"R's data sets: {error}")
    cases.extend(real_cases(load_diabetes_data()))
    try:
        movielens, description = movielens_two_users()
    except DataUnavailableError as error:
        skipped.append(f"MovieLens: {error}")
    else:
        cases.extend(real_cases(movielens, f"{movielens.spec.source}; {description}"))
    return cases


# --------------------------------------------------------------------------- R


def r_unavailable_reason(rscript: str = "Rscript") -> str | None:
    """Why the R side cannot run here, or ``None`` when Rscript and its packages are there."""
    if shutil.which(rscript) is None:
        return f"{rscript} is not installed"
    loads = "; ".join(f"library({package})" for package in R_PACKAGES)
    completed = subprocess.run(
        [rscript, "-e", f"suppressPackageStartupMessages({{{loads}}})"],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"the R packages {', '.join(R_PACKAGES)} do not all load: {last_line}"
    return None


def r_versions(rscript: str = "Rscript") -> str:
    """R, flexmix and mixtools versions, as one line."""
    expression = (
        'cat(R.version.string, "; flexmix ", format(packageVersion("flexmix")), '
        '"; mixtools ", format(packageVersion("mixtools")), sep = "")'
    )
    completed = subprocess.run(
        [rscript, "-e", expression], capture_output=True, text=True, check=False
    )
    return completed.stdout.strip() or "unknown R versions"


def write_training_csv(path: Path, X: FloatArray, y: FloatArray) -> None:
    """Write the target and the features (columns y, x1, ..., xd) at full precision."""
    header = ",".join(["y", *(f"x{index + 1}" for index in range(X.shape[1]))])
    np.savetxt(
        path, np.column_stack([y, X]), fmt="%.17g", delimiter=",", header=header, comments=""
    )


_COUNT_COLUMNS = (
    "starts_done",
    "starts_failed",
    "starts_timed_out",
    "starts_not_converged",
    "internal_restarts",
)


def read_peer_fits(path: Path, n_features: int) -> list[PeerFit]:
    """Read the fits written by ``bench/peers_r/fit_peers.R``.

    Parameters
    ----------
    path : Path
        The R script's output: one row per fitted component (a fit that produced nothing has
        one row with NA coefficients).
    n_features : int
        Number of slopes per component.

    Returns
    -------
    fits : list of PeerFit
        One per (package, seed), in the order of the file.
    """
    grouped: dict[tuple[str, int], list[dict[str, str]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            grouped.setdefault((row["package"], int(row["seed"])), []).append(row)
    slope_columns = [f"slope_{index + 1}" for index in range(n_features)]
    fits = []
    for (package, seed), rows in grouped.items():
        first = rows[0]
        lines = None
        if first["status"] == "ok":
            coefficients = np.array(
                [[_r_float(row[column]) for column in slope_columns] for row in rows]
            )
            intercepts = np.array([_r_float(row["intercept"]) for row in rows])
            if np.isfinite(coefficients).all() and np.isfinite(intercepts).all():
                lines = Lines(
                    coef=coefficients.reshape(len(rows), n_features), intercept=intercepts
                )
        fits.append(
            PeerFit(
                package=package,
                seed=seed,
                lines=lines,
                seconds=_r_float(first["seconds"]),
                loglik=_r_float(first["loglik"]),
                counts={column: int(_r_float(first[column])) for column in _COUNT_COLUMNS},
                message=first.get("message", "") or "",
            )
        )
    return fits


def _r_float(text: str) -> float:
    """A number written by R's ``write.csv`` (``NA`` and empty cells are NaN)."""
    return math.nan if text in ("NA", "", "NaN") else float(text)


def fit_peers(case: Case, settings: Settings, rscript: str = "Rscript") -> list[PeerFit]:
    """Fit flexmix and mixtools on the case's training rows with Rscript, for every seed."""
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        train_path, output_path = scratch / "train.csv", scratch / "fits.csv"
        write_training_csv(train_path, case.X_train, case.y_train)
        completed = subprocess.run(
            [
                rscript,
                str(R_SCRIPTS / "fit_peers.R"),
                str(train_path),
                str(case.n_components),
                ",".join(str(seed) for seed in range(settings.n_seeds)),
                str(settings.n_starts),
                str(settings.mixtools_budget_seconds),
                str(output_path),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            last_lines = " ".join(completed.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"Rscript fit_peers.R failed on {case.name}: {last_lines}")
        return read_peer_fits(output_path, case.X_train.shape[1])


def peer_runs(case: Case, fits: Sequence[PeerFit], n_starts: int) -> list[MethodRuns]:
    """Score the R fits and describe what happened in their starts."""
    runs = []
    for package in R_METHODS:
        run = MethodRuns(package)
        package_fits = [fit for fit in fits if fit.package == package]
        for fit in package_fits:
            run.add(case, fit.lines, fit.seconds)
        run.note = describe_peer_fits(package, package_fits, case.n_components, n_starts)
        runs.append(run)
    return runs


def describe_peer_fits(
    package: str, fits: Sequence[PeerFit], n_components: int, n_starts: int
) -> str:
    """What went wrong or oddly in one package's fits, in a few words ('' if nothing did)."""
    notes = []
    n_seeds = len(fits)
    fewer_lines = sum(
        1 for fit in fits if fit.lines is not None and len(fit.lines.intercept) < n_components
    )
    if fewer_lines:
        notes.append(f"fewer than {n_components} components kept in {fewer_lines}/{n_seeds} seeds")
    totals = {column: sum(fit.counts[column] for fit in fits) for column in _COUNT_COLUMNS}
    if package == "flexmix":
        if totals["starts_not_converged"]:
            notes.append(
                f"best start stopped at the iteration cap in {totals['starts_not_converged']}"
                f"/{n_seeds} seeds"
            )
    else:
        planned = n_starts * n_seeds
        not_run = (
            planned - totals["starts_done"] - totals["starts_failed"] - totals["starts_timed_out"]
        )
        notes.append(f"{totals['starts_done']}/{planned} starts finished")
        if totals["starts_failed"]:
            notes.append(f"{totals['starts_failed']} errors")
        if totals["starts_timed_out"] or not_run:
            notes.append(f"{totals['starts_timed_out'] + not_run} cut by the time budget")
        if totals["starts_not_converged"]:
            notes.append(f"{totals['starts_not_converged']} not converged")
        if totals["internal_restarts"]:
            notes.append(f"{totals['internal_restarts']} internal restarts")
    failed = [fit for fit in fits if fit.lines is None]
    if failed:
        messages = sorted({fit.message for fit in failed if fit.message})
        notes.append(
            f"no lines in {len(failed)}/{n_seeds} seeds"
            + (f" ({'; '.join(messages)[:120]})" if messages else "")
        )
    return "; ".join(notes)


# --------------------------------------------------------------------------- mixreg


def default_algorithm() -> str:
    """The estimator's default ``algorithm``."""
    parameter = inspect.signature(mixreg.MixtureOfLinearRegressions).parameters["algorithm"]
    return str(parameter.default)


def mixreg_label(algorithm: str, default: str) -> str:
    """Row label of a mixreg algorithm, marking the default."""
    return f"mixreg {algorithm}" + (" (default)" if algorithm == default else "")


def mixreg_runs(case: Case, algorithms: Sequence[str], settings: Settings) -> list[MethodRuns]:
    """Fit every mixreg algorithm with its defaults, once per seed.

    A fit that raises is counted and reported; convergence warnings are counted in the notes.
    """
    default = default_algorithm()
    runs = []
    for algorithm in algorithms:
        run = MethodRuns(mixreg_label(algorithm, default))
        errors = set()
        n_not_converged = 0
        for seed in range(settings.n_seeds):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                started = time.perf_counter()
                try:
                    estimator = mixreg.MixtureOfLinearRegressions(
                        n_components=case.n_components, algorithm=algorithm, random_state=seed
                    ).fit(case.X_train, case.y_train)
                except Exception as error:  # a failing algorithm is reported, not fatal
                    run.add(case, None, time.perf_counter() - started)
                    errors.add(f"{type(error).__name__}: {error}")
                    continue
                seconds = time.perf_counter() - started
            if any(warning.category.__name__ == "ConvergenceWarning" for warning in caught):
                n_not_converged += 1
            run.add(case, Lines(estimator.coef_, estimator.intercept_), seconds)
        notes = []
        if n_not_converged:
            notes.append(f"convergence warning in {n_not_converged}/{settings.n_seeds} seeds")
        if errors:
            notes.append(f"failed in {run.n_failed} seeds: {'; '.join(sorted(errors))[:160]}")
        run.note = "; ".join(notes)
        runs.append(run)
    return runs


def least_squares_run(case: Case) -> MethodRuns:
    """The one-line least-squares fit (deterministic: one fit)."""
    run = MethodRuns(LEAST_SQUARES)
    started = time.perf_counter()
    fit = reference_least_squares(case.X_train, case.y_train)
    run.add(case, Lines(fit.coef, fit.intercept), time.perf_counter() - started)
    return run


def line_pair_search_applies(case: Case) -> bool:
    """Whether the case has k = 2 and one feature, where the line-pair search is defined."""
    return case.n_components == 2 and case.X_train.shape[1] == 1


def line_pair_run(case: Case, max_evaluations: float = MAX_LINE_PAIR_EVALUATIONS) -> MethodRuns:
    """The line-pair search (``bench.line_pairs``) on a k = 2, one-feature case.

    When scoring every pair would cost more than ``max_evaluations`` row evaluations the
    search is not run, and the row's note says so.
    """
    if not line_pair_search_applies(case):
        raise ValueError(f"the line-pair search needs k = 2 and one feature: {case.name}")
    run = MethodRuns(LINE_PAIR)
    x, y = case.X_train[:, 0], case.y_train
    n_lines = len(candidate_lines(x, y))
    cost = pair_cost(n_lines, len(y))
    if cost > max_evaluations:
        run.note = f"not run: {n_lines} lines, {cost:.2g} row evaluations > {max_evaluations:.2g}"
        return run
    found = line_pair_search(x, y)
    run.add(case, Lines(found.coef, found.intercept), found.seconds)
    run.note = (
        f"{found.n_lines:,} lines, {found.n_pairs:,} pairs ({cost:.2g} row evaluations); "
        f"best pair before polishing {format_number(found.best_pair_loss)}; best "
        f"{found.n_polished} pairs polished"
    )
    return run


# --------------------------------------------------------------------------- report


def format_number(value: float) -> str:
    """A loss with about 3 significant digits (trailing zeros kept); '—' when missing."""
    if not math.isfinite(value):
        return "—"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 10:
        return f"{value:.2f}"
    if magnitude >= 1 or value == 0:
        return f"{value:.3f}"
    return f"{value:#.3g}"


def format_precise(value: float) -> str:
    """A min-loss with 4 significant digits (all of its integer part); '—' when missing."""
    if not math.isfinite(value):
        return "—"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:#.4g}".removesuffix(".")


def format_ratio(value: float) -> str:
    """A ratio to the best R package, e.g. ``0.973``; '—' when missing."""
    return f"{value:.3f}" if math.isfinite(value) else "—"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, followed by an empty line."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def case_table(result: CaseResult) -> list[str]:
    """Per-method rows of one case: losses, time, ratio to the better R package, notes."""
    best_r = result.best_r_train()
    rows = []
    for run in result.runs:
        has_ratio = run.method.startswith("mixreg ") or run.method == LINE_PAIR
        n_ok = len(run.train_losses)
        n_seeds = n_ok + run.n_failed
        seconds = float(np.mean(run.seconds)) if run.seconds else math.nan
        rows.append(
            [
                run.method,
                format_number(run.train_mean),
                format_number(run.test_mean),
                f"{seconds:.3f}" if math.isfinite(seconds) else "—",
                format_ratio(ratio(run.train_mean, best_r)) if has_ratio else "",
                run.note + (f" (mean of {n_ok}/{n_seeds} seeds)" if run.n_failed and n_ok else ""),
            ]
        )
    return markdown_table(
        [
            "method",
            "train min-loss",
            "test min-loss",
            "s / fit",
            "ratio to best R (train)",
            "notes",
        ],
        rows,
    )


@dataclass(frozen=True)
class RatioSummary:
    """One mixreg algorithm's ratios to the better R package over all cases."""

    method: str
    train_ratios: dict[str, float]
    test_ratios: dict[str, float]

    @property
    def finite_train(self) -> list[float]:
        return [value for value in self.train_ratios.values() if math.isfinite(value)]

    @property
    def mean_train(self) -> float:
        return float(np.mean(self.finite_train)) if self.finite_train else math.nan

    @property
    def max_train(self) -> float:
        return max(self.finite_train) if self.finite_train else math.nan

    @property
    def worst_case(self) -> str:
        finite = {name: value for name, value in self.train_ratios.items() if math.isfinite(value)}
        return max(finite, key=lambda name: finite[name]) if finite else "—"

    @property
    def n_within_target(self) -> int:
        return sum(1 for value in self.finite_train if value <= ACCEPTANCE_RATIO)

    @property
    def mean_test(self) -> float:
        finite = [value for value in self.test_ratios.values() if math.isfinite(value)]
        return float(np.mean(finite)) if finite else math.nan


def ratio_summaries(results: Sequence[CaseResult]) -> list[RatioSummary]:
    """Per mixreg algorithm, its train and test ratios to the better R package on every case.

    The test ratio compares with the test min-loss of the R package that fitted the training
    rows better.
    """
    methods: list[str] = []
    for result in results:
        for run in result.runs:
            if run.method.startswith("mixreg ") and run.method not in methods:
                methods.append(run.method)
    summaries = []
    for method in methods:
        train_ratios, test_ratios = {}, {}
        for result in results:
            found = next((run for run in result.runs if run.method == method), None)
            if found is None:
                continue
            train_ratios[result.case.name] = ratio(found.train_mean, result.best_r_train())
            test_ratios[result.case.name] = ratio(found.test_mean, result.best_r_test())
        summaries.append(RatioSummary(method, train_ratios, test_ratios))
    return summaries


def summary_table(summaries: Sequence[RatioSummary], n_cases: int) -> list[str]:
    """The headline table: mean and max training ratio per mixreg algorithm."""
    rows = [
        [
            summary.method,
            format_ratio(summary.mean_train),
            format_ratio(summary.max_train),
            summary.worst_case,
            f"{summary.n_within_target}/{n_cases}",
            format_ratio(summary.mean_test),
        ]
        for summary in summaries
    ]
    return markdown_table(
        [
            "mixreg algorithm",
            "mean train ratio",
            "max train ratio",
            "worst data set",
            f"data sets ≤ {ACCEPTANCE_RATIO}",
            "mean test ratio",
        ],
        rows,
    )


def best_known_table(results: Sequence[CaseResult], default: str) -> list[str]:
    """Per case: the best known training min-loss, who reached it, and R and the default vs it."""
    label = mixreg_label(default, default)
    rows = []
    for result in results:
        best = result.best_known_train()
        line_pair = result.run(LINE_PAIR)
        default_run = result.run(label)
        default_mean = default_run.train_mean if default_run is not None else math.nan
        better_r = result.better_r_method()
        rows.append(
            [
                result.case.name,
                format_precise(best),
                ", ".join(short_method(method) for method in result.reached_best_known()),
                format_precise(line_pair.train_mean) if line_pair is not None else "",
                f"{format_precise(result.best_r_train())} ({better_r})" if better_r else "—",
                format_ratio(ratio(result.best_r_train(), best)),
                format_precise(default_mean),
                format_ratio(ratio(default_mean, best)),
            ]
        )
    return markdown_table(
        [
            "data set",
            "best known train min-loss",
            "reached by (best seed)",
            "line-pair search",
            "better R package (mean)",
            "better R / best known",
            f"`{default}` (mean)",
            f"`{default}` / best known",
        ],
        rows,
    )


def short_method(method: str) -> str:
    """A method's name without the ``mixreg `` prefix and default mark, for dense cells."""
    if method == LINE_PAIR:
        return "line-pair search"
    return method.removeprefix("mixreg ").removesuffix(" (default)")


def acceptance_lines(
    summaries: Sequence[RatioSummary], results: Sequence[CaseResult], default: str
) -> list[str]:
    """The issue's criterion as written, then, for each data set that misses it, how far the
    better R package is from the best known min-loss and whether the default reaches it."""
    n_cases = len(results)
    label = mixreg_label(default, default)
    summary = next((summary for summary in summaries if summary.method == label), None)
    if summary is None:
        return [f"Acceptance (issue 6): the default algorithm `{default}` was not run.", ""]
    met = summary.n_within_target == n_cases
    lines = [
        f"Acceptance (issue 6), as written: the default algorithm `{default}` reaches at most "
        f"{ACCEPTANCE_RATIO}x the better R package's training min-loss on "
        f"{summary.n_within_target} of {n_cases} data sets (max ratio "
        f"{format_ratio(summary.max_train)}, on {summary.worst_case}): "
        + ("**met**." if met else "**not met**."),
        "",
    ]
    missed = [
        result
        for result in results
        if not summary.train_ratios.get(result.case.name, math.nan) <= ACCEPTANCE_RATIO
    ]
    if not missed:
        return lines
    details = []
    n_unreachable = n_equal = 0
    for result in missed:
        best = result.best_known_train()
        best_r = result.best_r_train()
        default_run = result.run(label)
        default_mean = default_run.train_mean if default_run is not None else math.nan
        unreachable = math.isfinite(best_r) and ACCEPTANCE_RATIO * best_r < best
        equal = same_loss(default_mean, best)
        n_unreachable += unreachable
        n_equal += equal
        gap = abs(default_mean - best) / best if best > 0 else 0.0
        scaled_r = ACCEPTANCE_RATIO * best_r
        details.append(
            f"- {result.case.name}: `{default}` / better R "
            f"{format_ratio(ratio(default_mean, best_r))}; better R "
            f"({result.better_r_method() or '—'}, {format_precise(best_r)}) / best known "
            f"({format_precise(best)}) {format_ratio(ratio(best_r, best))}, so "
            f"{ACCEPTANCE_RATIO} times better R ({format_precise(scaled_r)}) is "
            + ("below" if unreachable else "not below")
            + f" the best known; `{default}` (mean over seeds) "
            + (
                f"equals the best known (relative gap {gap:.1e})."
                if equal
                else f"is {format_ratio(ratio(default_mean, best))} times the best known."
            )
        )
    lines += [
        f"On the {len(missed)} data sets that miss it: the better R package's mean training "
        f"min-loss is within 1 % of the best known one on {n_unreachable} of {len(missed)} "
        f"({ACCEPTANCE_RATIO} times it is below the lowest training min-loss any method "
        f"reached in this run), and `{default}`'s mean training min-loss equals the best known "
        f"(relative gap ≤ {SAME_LOSS_RTOL:.0e}) on {n_equal} of {len(missed)}.",
        "",
        *details,
        "",
    ]
    return lines


def data_table(cases: Sequence[CaseInfo]) -> list[str]:
    """Source, target, features and row counts of each data set."""
    rows = []
    seen = set()
    for case in cases:
        if case.title in seen:
            continue
        seen.add(case.title)
        ks = ", ".join(str(other.n_components) for other in cases if other.title == case.title)
        rows.append(
            [
                case.title,
                case.source,
                case.target,
                ", ".join(case.features),
                f"{case.n_train} / {case.n_test}",
                ks,
            ]
        )
    return markdown_table(
        ["data set", "source", "target", "features", "rows train / test", "k"], rows
    )


@dataclass(frozen=True)
class RunRecord:
    """Everything the peers section is built from; saved to and read from a JSON file."""

    results: list[CaseResult]
    settings: Settings
    header_lines: list[str]
    skipped: list[str]
    elapsed_seconds: float
    end_load: str
    quick: bool
    default: str


def build_section(record: RunRecord) -> list[str]:
    """The Markdown of the peers section (without its markers)."""
    results, settings, default = record.results, record.settings, record.default
    summaries = ratio_summaries(results)
    cases = [result.case for result in results]
    lines = ["## Side by side with R's flexmix and mixtools (issue 6)", ""]
    if record.quick:
        lines += ["**Quick smoke run: fewer seeds and starts than the benchmark.**", ""]
    lines += ["Machine and run:", "", *record.header_lines, ""]
    lines += [
        f"Every method is fitted with seeds 0..{settings.n_seeds - 1} on the same training "
        "rows; cells are means over the seeds. flexmix: `stepFlexmix(y ~ ., k = k, nrep = "
        f"{settings.n_starts})` (its defaults otherwise: at most 200 EM iterations, components "
        "whose prior falls below 0.05 are dropped). mixtools: "
        f"{settings.n_starts} starts of `regmixEM(y, X, k = k)` (its defaults), the best "
        "log-likelihood kept; a start that raises an error is counted and skipped, and the "
        f"starts of one seed share {settings.mixtools_budget_seconds:.0f} s of wall time (a "
        "start running at the end is stopped, later ones are not made). mixreg: every "
        f"algorithm of `mixreg.ALGORITHMS` with its defaults, `random_state` = seed; the "
        f"default is `{default}`. R writes each component's intercept and slopes; every "
        "min-loss, (1/n) Σ_i min_j (y_i - x_i·coef_j - intercept_j)², is computed in Python by "
        "the same function. *ratio to best R*: the mixreg algorithm's (or the line-pair "
        "search's) mean training min-loss divided by the lower of flexmix's and mixtools' "
        "(below 1: it fits the training rows better). s / fit: wall time of one seed's fit "
        "(for R, all its starts, inside R, single-threaded; mixreg may use both cores). The "
        "real data sets are split once, 80 % / 20 %, at random with seed 0.",
        "",
        f"*{LINE_PAIR}*, a reference with no random start, run on the data sets with one "
        "feature and k = 2: the candidate lines are every line through two training points "
        "(pairs with equal x left out) and the flat line through each point, duplicates "
        "removed; every pair of candidates is scored by its min-loss on all the training rows "
        f"(in float32), and the best {N_POLISHED} pairs are polished by classical AM "
        f"(`mixreg._am.classic_am_batch`, at most {POLISH_MAX_ITER} refits, until the "
        "partition stops changing). It is run when scoring the pairs costs at most "
        f"{MAX_LINE_PAIR_EVALUATIONS:.0e} row evaluations (pairs times rows); its cost grows like "
        "n⁵ / 8 for n rows. *Best known* min-loss of a data set: the lowest training min-loss "
        "of any method and any seed of this run, the line-pair search included; it is not "
        "proven to be the lowest possible. Every seed's min-losses and times are saved in "
        f"`bench/{DEFAULT_RUNS.name}`; `python -m bench.peers --summary-only` rebuilds this "
        "section from them without fitting anything.",
        "",
        "### Data sets",
        "",
        *data_table(cases),
    ]
    lines += [f"Not included: {reason}" for reason in record.skipped]
    if record.skipped:
        lines.append("")
    lines += [
        "### Ratio of mixreg's training min-loss to the better R package",
        "",
        *summary_table(summaries, len(cases)),
        "### Best known training min-loss",
        "",
        "*reached by*: the methods whose best seed is within a relative "
        f"{SAME_LOSS_RTOL:.0e} of the best known min-loss. The other columns are means over "
        "the seeds.",
        "",
        *best_known_table(results, default),
        *acceptance_lines(summaries, results, default),
        f"Peers benchmark time: {record.elapsed_seconds / 60:.1f} min; load average (1, 5, 15 "
        f"min) at the end: {record.end_load} (a machine shared with other work: times are "
        "indicative).",
        "",
    ]
    for result in results:
        lines += [f"### {result.case.name}", "", *case_table(result)]
    return lines


# --------------------------------------------------------------------------- saved runs


def record_to_json(record: RunRecord) -> dict[str, Any]:
    """A JSON-ready dict of a run: every seed's min-losses and times, no data rows."""
    return {
        "format": RUNS_FORMAT,
        "settings": dataclasses.asdict(record.settings),
        "header_lines": list(record.header_lines),
        "skipped": list(record.skipped),
        "elapsed_seconds": record.elapsed_seconds,
        "end_load": record.end_load,
        "quick": record.quick,
        "default": record.default,
        "cases": [
            {
                "case": dataclasses.asdict(result.case),
                "runs": [dataclasses.asdict(run) for run in result.runs],
            }
            for result in record.results
        ],
    }


def record_from_json(data: dict[str, Any]) -> RunRecord:
    """The inverse of :func:`record_to_json`."""
    if data.get("format") != RUNS_FORMAT:
        raise ValueError(f"saved runs of format {data.get('format')!r}; expected {RUNS_FORMAT}")
    results = []
    for entry in data["cases"]:
        case = {**entry["case"], "features": tuple(entry["case"]["features"])}
        results.append(CaseResult(CaseInfo(**case), [MethodRuns(**run) for run in entry["runs"]]))
    return RunRecord(
        results=results,
        settings=Settings(**data["settings"]),
        header_lines=list(data["header_lines"]),
        skipped=list(data["skipped"]),
        elapsed_seconds=float(data["elapsed_seconds"]),
        end_load=str(data["end_load"]),
        quick=bool(data["quick"]),
        default=str(data["default"]),
    )


def save_record(path: Path, record: RunRecord) -> None:
    """Write a run's results to ``path`` as JSON."""
    path.write_text(json.dumps(record_to_json(record), indent=1) + "\n")


def load_record(path: Path) -> RunRecord:
    """Read a run saved by :func:`save_record`."""
    return record_from_json(json.loads(path.read_text()))


# --------------------------------------------------------------------------- main


def run_case(case: Case, settings: Settings, algorithms: Sequence[str]) -> CaseResult:
    """Every method on one case."""
    log(f"{case.name}: flexmix and mixtools ({len(case.y_train)} training rows)")
    try:
        fits = fit_peers(case, settings)
    except RuntimeError as error:
        log(str(error))
        failed = [
            MethodRuns(package, n_failed=settings.n_seeds, note=str(error)) for package in R_METHODS
        ]
        peer = failed
    else:
        peer = peer_runs(case, fits, settings.n_starts)
    log(f"{case.name}: mixreg")
    runs = [least_squares_run(case), *peer, *mixreg_runs(case, algorithms, settings)]
    if line_pair_search_applies(case):
        log(f"{case.name}: line-pair search")
        runs.append(line_pair_run(case))
    return CaseResult(case.info(), runs)


def _command_line(argv: Sequence[str]) -> str:
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(Path.cwd())
    return " ".join([str(python), "-m", "bench.peers", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Compare mixreg with R's flexmix and mixtools; write a section of "
        "bench/RESULTS.md.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 seeds, 3 starts, 5 s mixtools budget"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="Markdown file whose peers section is written (default: bench/RESULTS.md for a "
        "full run; a quick run writes only when this is given)",
    )
    parser.add_argument(
        "--runs",
        type=Path,
        help="JSON file of every seed's min-losses and times: written after a run (default: "
        "bench/peers_runs.json for a full run; a quick run writes only when this is given), "
        "read by --summary-only (default: bench/peers_runs.json)",
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="fit nothing: rebuild the section from the saved runs (--runs) and write it",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="refit only mixreg's default, beside the saved runs of everything else (--runs): "
        "checks that a change of the default makes no data set worse without refitting R",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        metavar="NAME",
        help="only the data sets whose title contains one of these words (case-insensitive)",
    )
    args = parser.parse_args(argv)

    if args.summary_only:
        record = load_record(args.runs or DEFAULT_RUNS)
        output = args.output if args.output or record.quick else DEFAULT_OUTPUT
        return write_report(build_section(record), output)

    reason = r_unavailable_reason()
    if reason is not None:
        print(f"bench.peers: skipped: {reason}", flush=True)
        return 0
    if args.default_only:
        return refit_default(args.runs or DEFAULT_RUNS, args.output or DEFAULT_OUTPUT, argv)
    settings = QUICK if args.quick else FULL
    output = args.output if args.output or args.quick else DEFAULT_OUTPUT
    runs_path = args.runs if args.runs or args.quick else DEFAULT_RUNS
    command = _command_line(sys.argv[1:] if argv is None else argv)
    header_lines = machine_lines(command, also=r_versions())
    started = time.perf_counter()
    skipped: list[str] = []
    cases = all_cases(skipped)
    if args.datasets:
        words = [word.lower() for word in args.datasets]
        cases = [case for case in cases if any(word in case.title.lower() for word in words)]
    algorithms = list(mixreg.ALGORITHMS)
    results = [run_case(case, settings, algorithms) for case in cases]
    record = RunRecord(
        results=results,
        settings=settings,
        header_lines=header_lines,
        skipped=skipped,
        elapsed_seconds=time.perf_counter() - started,
        end_load=load_average(),
        quick=args.quick,
        default=default_algorithm(),
    )
    if runs_path is not None:
        save_record(runs_path, record)
        log(f"saved every seed's results to {runs_path}")
    return write_report(build_section(record), output)


def refit_default(runs_path: Path, output: Path, argv: Sequence[str] | None) -> int:
    """Refit mixreg's default on every saved case, keep every other method's saved runs, and
    write the section and the runs again; print each case's old and new mean training
    min-loss of the default."""
    record = load_record(runs_path)
    default = default_algorithm()
    label = mixreg_label(default, default)
    skipped: list[str] = []
    cases = {(case.title, case.n_components): case for case in all_cases(skipped)}
    results = []
    for result in record.results:
        case = cases.get((result.case.title, result.case.n_components))
        if case is None:
            results.append(result)
            continue
        log(f"{case.name}: mixreg {default}")
        new = mixreg_runs(case, [default], record.settings)[0]
        old = next((run for run in result.runs if run.method == label), None)
        before = math.nan if old is None else old.train_mean
        print(
            f"{result.case.title}, k = {result.case.n_components}: default train min-loss "
            f"{before:.6g} -> {new.train_mean:.6g} ({ratio(new.train_mean, before):.4f}x)",
            flush=True,
        )
        runs = [new if run.method == label else run for run in result.runs]
        results.append(dataclasses.replace(result, runs=runs))
    command = _command_line(sys.argv[1:] if argv is None else argv)
    updated = dataclasses.replace(
        record,
        results=results,
        header_lines=[
            *record.header_lines,
            f"- Then `{command}` refitted mixreg's default alone on "
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC (load average at the start: "
            f"{load_average()}); every other method's figures are those of the run above",
        ],
        default=default,
    )
    save_record(runs_path, updated)
    return write_report(build_section(updated), output)


def write_report(section: Sequence[str], output: Path | None) -> int:
    """Print the section, and write it into ``output`` when given."""
    print("\n".join(section), flush=True)
    if output is not None:
        write_section(output, SECTION, "\n".join(section))
        log(f"wrote the peers section of {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
