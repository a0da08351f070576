"""Wide data and seed stability of the default fit.

``python -m bench.wide_and_seeds`` prints two markdown tables:

- **wide**: 20,000 rows from 3 lines with 5 informative features (the others have zero
  slopes) and noise 0.1, p = 100, 150, 300, 1,000 features; the default with k = 3 and no
  time budget: wall time, the fit's peak traced memory (tracemalloc) against the size of X,
  and its training min-loss against the true lines' (the oracle's).
- **seeds**: a real-like set of 48,000 rows and 14 features (mixed scales, offsets far from
  zero, noise that grows with one feature, a piecewise-linear target), k = 4: the default's
  training min-loss for random_state 0..9, its ratio to the best known (the best of long
  searches, ``n_init=100``, over a few seeds, and of the default fits) and its time.

Options: ``--wide P [P ...]`` (features to run), ``--seeds N``, ``--long-seeds N``,
``--skip-wide``, ``--skip-seeds``.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.exceptions import ConvergenceWarning

from mixreg import DegenerateFitWarning, MixtureOfLinearRegressions, min_loss

FloatArray = NDArray[np.float64]

WIDE_ROWS = 20_000
WIDE_FEATURES = (100, 150, 300, 1000)
INFORMATIVE = 5


def wide_set(n_rows: int, n_features: int, seed: int = 0) -> tuple[FloatArray, FloatArray, float]:
    """Rows from 3 lines with :data:`INFORMATIVE` informative features, noise 0.1; returns X,
    y and the true lines' min-loss."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, n_features))
    truth = np.zeros((3, n_features))
    truth[:, :INFORMATIVE] = 3.0 * rng.standard_normal((3, INFORMATIVE))
    owner = rng.integers(0, 3, size=n_rows)
    y = np.einsum("ij,ij->i", X, truth[owner]) + 0.1 * rng.standard_normal(n_rows)
    return X, y, float(min_loss(y, X @ truth.T))


def real_like_set(n_rows: int = 48_000, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """A wide real-like regression set: 14 features of mixed scales and offsets, k = 4 lines
    fitted to a non-linear target.

    The features are standard-normal draws put in raw units (a year, a price in dollars, an
    area, shares, a timestamp, measurements from 1e-3 to 1e4); the target is the largest of
    10 random planes of the draws (a convex piecewise-linear surface with more pieces than
    lines, as prices with thresholds and caps are), plus a sine of one feature, with noise
    whose spread grows with another.
    """
    rng = np.random.default_rng(seed)
    n_features, n_planes = 14, 10
    z = rng.standard_normal((n_rows, n_features))
    slopes = rng.standard_normal((n_planes, n_features))
    offsets = rng.standard_normal(n_planes)
    signal = (z @ slopes.T + offsets).max(axis=1) + 0.5 * np.sin(2.0 * z[:, 0])
    noise = 0.1 * (1.0 + np.abs(z[:, 1])) * rng.standard_normal(n_rows)
    scales = np.array([8.0, 5e4, 30.0, 0.1, 3e6, 1e-3, 1.0, 2.0, 1e4, 0.5, 50.0, 1.0, 3.0, 0.02])
    shifts = np.array(
        [2005.0, 2e5, 120.0, 0.3, 1.6e9, 0.0, 0.0, 10.0, 5e4, 0.0, 0.0, 1.0, 0.0, 0.0]
    )
    X = z * scales + shifts
    return X, 100.0 * (signal + noise)


def _fit(X: FloatArray, y: FloatArray, k: int, **params: Any) -> MixtureOfLinearRegressions:
    return MixtureOfLinearRegressions(k, **params).fit(X, y)


def measured(work: Callable[[], Any], trace: bool) -> tuple[Any, float, int]:
    """``work()``, its wall time and (when ``trace``) its peak traced memory in bytes."""
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", DegenerateFitWarning)
            result = work()
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
    finally:
        if trace:
            tracemalloc.stop()
    return result, seconds, peak


def wide_table(features: tuple[int, ...]) -> list[str]:
    lines = [
        f"Wide: {WIDE_ROWS:,} rows, k = 3, {INFORMATIVE} informative features, the default "
        "(no time budget).",
        "",
        "| p | X (MiB) | time (s) | peak traced MiB (x X) | min-loss | oracle | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in features:
        X, y, oracle = wide_set(WIDE_ROWS, p)
        fitted, seconds, peak = measured(partial(_fit, X, y, 3, random_state=0), True)
        loss = float(fitted.train_loss_)
        lines.append(
            f"| {p:,} | {X.nbytes / 2**20:.0f} | {seconds:.1f} | {peak / 2**20:.0f} "
            f"({peak / X.nbytes:.2f}x) | {loss:.5g} | {oracle:.5g} | {loss / oracle:.4f} |"
        )
        print(lines[-1], flush=True)
    return lines


def seeds_table(n_seeds: int, long_seeds: int) -> list[str]:
    X, y = real_like_set()
    runs = []
    for seed in range(n_seeds):
        fitted, seconds, _ = measured(partial(_fit, X, y, 4, random_state=seed), False)
        runs.append((seed, float(fitted.train_loss_), seconds))
        print(f"seed {seed}: {runs[-1][1]:.6g} in {seconds:.1f} s", flush=True)
    best_known = min(loss for _, loss, _ in runs)
    for seed in range(long_seeds):
        fitted, seconds, _ = measured(
            partial(_fit, X, y, 4, random_state=100 + seed, n_init=100), False
        )
        print(f"long search {100 + seed}: {fitted.train_loss_:.6g} in {seconds:.1f} s", flush=True)
        best_known = min(best_known, float(fitted.train_loss_))
    lines = [
        f"Seeds: real-like set, {X.shape[0]:,} rows x {X.shape[1]} features, k = 4; best known "
        f"{best_known:.6g} (the best of the default fits and of {long_seeds} searches with "
        "n_init=100).",
        "",
        "| random_state | min-loss | ratio to best known | time (s) |",
        "|---|---|---|---|",
    ]
    for seed, loss, seconds in runs:
        lines.append(f"| {seed} | {loss:.6g} | {loss / best_known:.5f} | {seconds:.1f} |")
    worst = max(loss for _, loss, _ in runs)
    lines.append("")
    lines.append(f"Worst of {n_seeds} seeds: {worst / best_known:.5f} x the best known.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wide", type=int, nargs="*", default=list(WIDE_FEATURES))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--long-seeds", type=int, default=3)
    parser.add_argument("--skip-wide", action="store_true")
    parser.add_argument("--skip-seeds", action="store_true")
    args = parser.parse_args()
    output: list[str] = []
    if not args.skip_wide:
        output += [*wide_table(tuple(args.wide)), ""]
    if not args.skip_seeds:
        output += seeds_table(args.seeds, args.long_seeds)
    print()
    print("\n".join(output))


if __name__ == "__main__":
    main()
