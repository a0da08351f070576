"""Wide data: the polish and the starts hold no n x p^2 or candidates x p^2 memory."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mixreg._am import classic_am_batch
from mixreg._lstsq import lstsq_by_labels
from mixreg._ransac import ransac_lines
from mixreg._subsample import parts_from_labels


def _peak(work: Callable[[], Any]) -> tuple[Any, int]:
    # One BLAS thread: the sizes here are small, and spinning threads on a loaded machine
    # turn a 200 x 200 factorization from a millisecond into a tenth of a second.
    tracemalloc.start()
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture(scope="module")
def wide() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n, p = 2_000, 200
    X = rng.standard_normal((n, p))
    truth = np.zeros((3, p))
    truth[:, :5] = 3 * rng.standard_normal((3, 5))
    owner = rng.integers(0, 3, size=n)
    y = np.einsum("ij,ij->i", X, truth[owner]) + 0.1 * rng.standard_normal(n)
    Z = np.column_stack([X, np.ones(n)])
    return Z, y, owner


def test_polish_of_many_starts_holds_no_starts_times_p_squared(wide: Any) -> None:
    Z, y, owner = wide
    rng = np.random.default_rng(1)
    # Starts near the truth's partition (a tenth of the rows moved), so the polish converges.
    labels = np.where(
        rng.random((16, Z.shape[0])) < 0.1, rng.integers(0, 3, size=Z.shape[0]), owner
    )
    starts, _ = lstsq_by_labels(Z, y, labels, 3)
    batch, peak = _peak(lambda: classic_am_batch(Z, y, starts, max_iter=50, tol=1e-8))
    # 16 starts x 3 parts x 201^2 moments alone would be 5.8 x Z.
    assert peak < 3 * Z.nbytes, peak / Z.nbytes
    assert batch.losses.max() < 0.02


def test_lines_of_many_partitions_hold_no_partitions_times_p_squared(wide: Any) -> None:
    Z, y, _ = wide
    labels = np.random.default_rng(2).integers(0, 3, size=(16, Z.shape[0]))
    (theta, counts), peak = _peak(lambda: lstsq_by_labels(Z, y, labels, 3))
    assert peak < 3 * Z.nbytes, peak / Z.nbytes
    # The same lines as each partition's own solve.
    for partition in (0, 15):
        alone, _ = lstsq_by_labels(Z, y, labels[partition : partition + 1], 3)
        np.testing.assert_allclose(theta[partition], alone[0], rtol=1e-9, atol=1e-12)
    assert counts.sum() == 16 * Z.shape[0]


def test_ransac_refit_of_all_rows_holds_no_trials_times_p_squared(wide: Any) -> None:
    Z, y, owner = wide
    parts, counts = parts_from_labels(owner[None, :], 3)
    theta, peak = _peak(
        lambda: ransac_lines(
            Z, y, parts, counts, np.random.default_rng(3), min_samples=Z.shape[1], max_trials=16
        )
    )
    # A round's 16 minimal subsets of 201 rows for 3 parts alone would be 4.8 x Z.
    assert peak < 3 * Z.nbytes, peak / Z.nbytes
    assert np.all(np.isfinite(theta))
