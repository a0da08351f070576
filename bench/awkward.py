"""Awkward data: features far from zero, mixed scales, wide tables, a dozen rows (issue 15).

Each case gives the default's answer beside scikit-learn's ``LinearRegression`` refitted on
the rows each line owns (or the known truth), with its time and peak traced memory; then the
paper's Friedman sets with the default (k = 2, its seeds), to compare with the head of
``bench/RESULTS.md``. Writes the ``awkward`` section of ``bench/RESULTS.md``.

    python -m bench.awkward [--quick] [--output FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression

from bench.algorithms import paper_datasets
from bench.sections import Report, load_average, log, machine_lines, write_section
from mixreg import DegenerateFitWarning, MixtureOfLinearRegressions, min_loss, select_n_components

FloatArray = NDArray[np.float64]
SECTION = "awkward"
DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")


@dataclass(frozen=True)
class Settings:
    offsets: tuple[float, ...]
    wide_features: tuple[int, ...]
    wide_rows: int
    tiny_rows: tuple[int, ...]
    tiny_seeds: int
    friedman_seeds: int


FULL = Settings(
    offsets=(1e3, 1e6, 1e9),
    wide_features=(100, 150, 500, 1000),
    wide_rows=20_000,
    tiny_rows=(10, 15, 20, 30, 50),
    tiny_seeds=3,
    friedman_seeds=3,
)
# Above this many features the wide fits get a time budget (their memory is the point; their
# time grows as p^2 per pass over the rows).
WIDE_BUDGET_FROM, WIDE_BUDGET_S = 500, 60.0
QUICK = Settings(
    offsets=(1e6,),
    wide_features=(100,),
    wide_rows=5_000,
    tiny_rows=(15, 40),
    tiny_seeds=2,
    friedman_seeds=1,
)


def measured(work: Callable[[], Any]) -> tuple[Any, float, int]:
    """``work()``, its wall time and its peak traced memory (bytes)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", DegenerateFitWarning)
            result = work()
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, seconds, peak


def refit_gap(
    estimator: MixtureOfLinearRegressions, X: FloatArray, y: FloatArray, scaled: bool = False
) -> float:
    """Largest relative difference between a line and ``LinearRegression`` on its own rows
    (fitted on features divided by their spread when ``scaled``, then mapped back)."""
    owner = estimator.best_component(X, y)
    gap = 0.0
    for line in range(estimator.n_components):
        rows = owner == line
        if rows.sum() < X.shape[1] + 2:
            continue
        spread = X[rows].std(axis=0) if scaled else np.ones(X.shape[1])
        spread[spread == 0] = 1.0
        reference = LinearRegression().fit(X[rows] / spread, y[rows])
        expected = np.append(reference.coef_ / spread, reference.intercept_)
        got = np.append(estimator.coef_[line], estimator.intercept_[line])
        gap = max(gap, float(np.abs(got - expected).max() / np.abs(expected).max()))
    return gap


def _mib(count: float) -> str:
    return f"{count / 2**20:.1f}"


def offsets_part(report: Report, settings: Settings) -> None:
    report.add(
        "### Features far from zero, and mixed scales",
        "",
        "`x = offset + N(0, 1)`, 1,000 rows, `y = 2x + N(0, 0.01²)`: the default with k = 1 "
        "and k = 2 beside `LinearRegression` (slope 2.000, min-loss 1.0e-4). Before issue 15 "
        "k = 1 gave slope 1.0 and min-loss 1.04 at an offset of 1e6.",
        "",
    )
    rows = []
    for offset in settings.offsets:
        rng = np.random.default_rng(0)
        X = offset + rng.standard_normal((1000, 1))
        y = 2.0 * X[:, 0] + rng.normal(scale=0.01, size=1000)
        reference = LinearRegression().fit(X, y)
        reference_loss = float(np.mean((reference.predict(X) - y) ** 2))
        for k in (1, 2):
            fitted, seconds, peak = measured(
                lambda k=k, X=X, y=y: MixtureOfLinearRegressions(k, random_state=0).fit(X, y)
            )
            rows.append(
                [
                    f"{offset:.0e}",
                    str(k),
                    ", ".join(f"{slope:.6f}" for slope in fitted.coef_[:, 0]),
                    f"{reference.coef_[0]:.6f}",
                    f"{fitted.train_loss_:.4g}",
                    f"{reference_loss:.4g}",
                    f"{refit_gap(fitted, X, y):.1e}",
                    f"{seconds:.2f}",
                    _mib(peak),
                ]
            )
    report.table(
        [
            "offset",
            "k",
            "default's slopes",
            "LinearRegression slope",
            "default min-loss",
            "LinearRegression min-loss",
            "line vs LinearRegression on its rows (relative)",
            "time (s)",
            "peak (MiB)",
        ],
        rows,
    )
    rng = np.random.default_rng(1)
    n = 2000
    scales = np.array([1e-3, 1.0, 1e6])
    offsets = np.array([1e3, -3e4, 1e12])
    X = offsets + rng.standard_normal((n, 3)) * scales
    truth = np.array([[1.0, -2.0, 0.5], [-1.5, 1.0, 2.0]]) / scales
    owner = rng.integers(0, 2, size=n)
    y = np.einsum("ij,ij->i", (X - offsets), truth[owner]) + 0.05 * rng.standard_normal(n)
    fitted, seconds, peak = measured(
        lambda: MixtureOfLinearRegressions(2, random_state=0).fit(X, y)
    )
    oracle = min_loss(y, np.column_stack([(X - offsets) @ line for line in truth]))
    report.add(
        "Mixed scales: 2,000 rows of 3 features with spreads 1e-3, 1, 1e6 around 1e3, "
        "-3e4, 1e12, two lines (noise 0.05): the default's min-loss "
        f"{fitted.train_loss_:.5g} (the true lines': {oracle:.5g}); each line against "
        f"`LinearRegression` on its rows: {refit_gap(fitted, X, y, scaled=True):.1e} "
        "(relative) when the features are divided by their spread first, "
        f"{refit_gap(fitted, X, y):.1e} on the raw features, where `LinearRegression`'s "
        "solve (unscaled columns whose spreads differ by 1e9) loses the small feature: "
        f"here the default is the better reference. {seconds:.2f} s, peak {_mib(peak)} MiB.",
        "",
    )


def wide_part(report: Report, settings: Settings) -> None:
    n = settings.wide_rows
    report.add(
        "### Wide data",
        "",
        f"{n:,} rows from 3 lines (noise 0.1, so the true lines' min-loss is about 0.01), "
        f"p features, the default with k = 3; from p = {WIDE_BUDGET_FROM} with a time budget "
        f"of {WIDE_BUDGET_S:.0f} s (the search stops there; its memory does not depend on "
        "it). Peak: the fit's own traced "
        "allocations (tracemalloc), against the size of X. Before issue 15 (issue text): 54x X "
        "and 25 s at p = 50, 154x X and 118 s at p = 150, ~150 GB needed at p = 1,000.",
        "",
    )
    rows = []
    for p in settings.wide_features:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, p))
        truth = rng.standard_normal((3, p))
        owner = rng.integers(0, 3, size=n)
        y = np.einsum("ij,ij->i", X, truth[owner]) + 0.1 * rng.standard_normal(n)
        log(f"wide: p={p} (load {load_average()})")
        budget = WIDE_BUDGET_S if p >= WIDE_BUDGET_FROM else None
        fitted, seconds, peak = measured(
            lambda X=X, y=y, budget=budget: MixtureOfLinearRegressions(
                3, random_state=0, time_budget=budget
            ).fit(X, y)
        )
        oracle = min_loss(y, X @ truth.T)
        rows.append(
            [
                f"{p:,}" + (f" (time budget {budget:.0f} s)" if budget else ""),
                f"{_mib(X.nbytes)}",
                f"{fitted.train_loss_:.4g}",
                f"{oracle:.4g}",
                f"{refit_gap(fitted, X, y):.1e}",
                f"{seconds:.1f}",
                f"{_mib(peak)} ({peak / X.nbytes:.2f}x)",
            ]
        )
    report.table(
        [
            "p",
            "X (MiB)",
            "default min-loss",
            "true lines' min-loss",
            "line vs LinearRegression on its rows (relative)",
            "time (s)",
            "peak MiB (x X)",
        ],
        rows,
    )


def tiny_part(report: Report, settings: Settings) -> None:
    report.add(
        "### A dozen rows: choosing k",
        "",
        "Rows from 2 (or 3) lines y = a x + b with a, b ~ N(0, 3²), x uniform on [-4, 4], "
        "noise 0.1; `select_n_components` over k = 1..6 (a k whose lines cannot each own p + 1 "
        "= 3 rows is skipped, and says so). Before issue 15 the sweep chose k = 6 on 15 rows "
        f"from 2 lines. Seeds 0..{settings.tiny_seeds - 1}; time per sweep.",
        "",
    )
    rows = []
    for n_lines in (2, 3):
        for n in settings.tiny_rows:
            chosen, times = [], []
            for seed in range(settings.tiny_seeds):
                rng = np.random.default_rng(1000 * n_lines + 10 * n + seed)
                x = rng.uniform(-4, 4, size=(n, 1))
                slopes, intercepts = rng.normal(scale=3, size=(2, n_lines))
                owner = rng.integers(0, n_lines, size=n)
                y = slopes[owner] * x[:, 0] + intercepts[owner] + 0.1 * rng.standard_normal(n)
                selection, seconds, _ = measured(
                    lambda x=x, y=y: select_n_components(x, y, range(1, 7), random_state=0)
                )
                chosen.append(selection.best_n_components)
                times.append(seconds)
            rows.append(
                [
                    str(n_lines),
                    str(n),
                    ", ".join(map(str, chosen)),
                    f"{sum(k == n_lines for k in chosen)} of {len(chosen)}",
                    f"{np.mean(times):.2f}",
                ]
            )
    report.table(["true k", "rows", "chosen k per seed", "right", "mean time per sweep (s)"], rows)


def friedman_part(report: Report, settings: Settings) -> None:
    report.add(
        "### The paper's sets, unchanged",
        "",
        f"The default (k = 2) on the Friedman sets of section a), seeds "
        f"0..{settings.friedman_seeds - 1}: mean test min-loss beside the head of this file "
        "(10 seeds, the run before issue 15).",
        "",
    )
    committed = {"Friedman 1": "8.21", "Friedman 2": "3025", "Friedman 3": "6.36"}
    rows = []
    for data in paper_datasets():
        if data.name not in committed:
            continue
        losses, times = [], []
        for seed in range(settings.friedman_seeds):
            fitted, seconds, _ = measured(
                lambda seed=seed, data=data: MixtureOfLinearRegressions(2, random_state=seed).fit(
                    data.X_train, data.y_train
                )
            )
            losses.append(fitted.min_loss(data.X_test, data.y_test))
            times.append(seconds)
        rows.append(
            [
                data.name,
                f"{np.mean(losses):.4g}",
                committed[data.name],
                f"{np.mean(times):.2f}",
            ]
        )
    report.table(
        ["data set", "default test min-loss (now)", "before issue 15", "mean fit time (s)"],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.awkward",
        description="The default on awkward data; write the awkward section of RESULTS.md.",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: one case of each")
    parser.add_argument(
        "--output",
        type=Path,
        help="Markdown file whose awkward section is written (default: bench/RESULTS.md for "
        "a full run; a quick run writes only when this is given)",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    output = args.output if args.output or args.quick else DEFAULT_OUTPUT
    command = " ".join(["python -m bench.awkward", *(sys.argv[1:] if argv is None else argv)])
    report = Report()
    report.add("## Awkward data (issue 15)", "", "Machine and run:", "")
    report.add(*machine_lines(command), "")
    report.add(
        "Times are wall-clock: a load average above the 2 cores (given above) means the "
        "machine was shared with other work and the times are longer than on a quiet one.",
        "",
    )
    for part in (offsets_part, tiny_part, friedman_part, wide_part):
        log(f"{part.__name__} (load {load_average()})")
        part(report, settings)
    report.add(f"Load average at the end: {load_average()}.")
    text = "\n".join(report.lines) + "\n"
    if output is not None:
        write_section(output, SECTION, text)
        log(f"wrote the awkward section of {output}")


if __name__ == "__main__":
    main()
