"""Streamed fits on a ``dask.distributed`` cluster of worker processes: the same lines as the
embedded streamed fit, bit for bit, and a pass whose worker dies is run again elsewhere."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from mixreg import ArrayChunks, Chunk, MixtureOfLinearRegressions, NpyChunks, write_npy_chunks
from mixreg._dask import DaskChunks

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

# Workers unpickle this module's classes by value: they cannot import the tests package.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CHUNK = 700


@pytest.fixture(scope="module")
def client() -> Iterator[distributed.Client]:
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    n_rows = 3_000
    X = rng.normal(size=(n_rows, 3)) + 5.0
    labels = rng.integers(0, 2, n_rows)
    coef = np.array([[1.0, -2.0, 0.5], [-1.5, 1.0, 2.0]])
    y = np.einsum("ij,ij->i", X, coef[labels]) + 3.0 * labels + 0.05 * rng.normal(size=n_rows)
    return X, y


def embedded(X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None):
    return MixtureOfLinearRegressions(n_components=2, random_state=3).fit(
        ArrayChunks(X, y, weights, chunk_size=CHUNK)
    )


def assert_equal_lines(first, second) -> None:
    np.testing.assert_array_equal(first.coef_, second.coef_)
    np.testing.assert_array_equal(first.intercept_, second.intercept_)
    np.testing.assert_array_equal(first.shares_, second.shares_)
    assert first.train_loss_ == second.train_loss_
    assert first.passes_ == second.passes_


def test_dask_arrays_fit_as_the_embedded_streamed_fit(client, rows) -> None:
    X, y = rows
    weights = np.random.default_rng(0).uniform(0.5, 2.0, y.size)
    on_cluster = MixtureOfLinearRegressions(n_components=2, random_state=3).fit(
        da.from_array(X, chunks=(CHUNK, 2)),
        da.from_array(y, chunks=CHUNK),
        sample_weight=da.from_array(weights, chunks=CHUNK),
    )
    assert_equal_lines(on_cluster, embedded(X, y, weights))


def test_a_dask_dataframe_fits_as_its_rows(client, rows) -> None:
    import pandas as pd

    X, y = rows
    frame = dd.from_pandas(pd.DataFrame(X, columns=["a", "b", "c"]), chunksize=CHUNK)
    target = dd.from_pandas(pd.Series(y), chunksize=CHUNK)
    on_cluster = MixtureOfLinearRegressions(n_components=2, random_state=3).fit(frame, target)
    # Its partitions are not the embedded fit's chunks: equal to rounding.
    in_process = embedded(X, y)
    np.testing.assert_allclose(on_cluster.coef_, in_process.coef_, rtol=1e-8)
    np.testing.assert_allclose(on_cluster.intercept_, in_process.intercept_, rtol=1e-8)


def test_tasks_read_their_own_chunks(client, rows, tmp_path) -> None:
    X, y = rows
    source = write_npy_chunks(
        tmp_path, [(X[i : i + CHUNK], y[i : i + CHUNK]) for i in range(0, y.size, CHUNK)]
    )
    on_cluster = MixtureOfLinearRegressions(n_components=2, random_state=3).fit(
        DaskChunks(source, client)
    )
    assert_equal_lines(on_cluster, embedded(X, y))


class DiesOnceReading(NpyChunks):
    """Chunks whose first reader of chunk 1 dies (its worker process exits)."""

    def read(self, index: int) -> Chunk:
        marker = self.directory / "killed"
        if index == 1 and not marker.exists():
            marker.touch()
            os._exit(1)
        return super().read(index)


def test_a_pass_whose_worker_dies_is_run_again(client, rows, tmp_path) -> None:
    X, y = rows
    write_npy_chunks(
        tmp_path, [(X[i : i + CHUNK], y[i : i + CHUNK]) for i in range(0, y.size, CHUNK)]
    )
    source = DiesOnceReading(tmp_path)
    on_cluster = MixtureOfLinearRegressions(n_components=2, random_state=3).fit(
        DaskChunks(source, client)
    )
    assert Path(tmp_path / "killed").exists()
    assert_equal_lines(on_cluster, embedded(X, y))


def test_dask_targets_of_other_rows_are_named(client, rows) -> None:
    X, y = rows
    with pytest.raises(ValueError, match="y has 2999 rows but X has 3000"):
        MixtureOfLinearRegressions(n_components=2).fit(
            da.from_array(X, chunks=(CHUNK, 3)), da.from_array(y[:-1], chunks=CHUNK)
        )
