"""A sample of a dataset's rows reads only the chunks it needs: its memory and the chunks it
reads are bounded by the sample, not by the dataset, and it is the same at every call."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from models_store import datasets as dataset_store
from models_store.session import session_scope

N_FEATURES = 4
CHUNK_ROWS = 2_000
N_CHUNKS = 250  # 500,000 rows, 16 MB of features: a plot would read all of it


@pytest.fixture
def big_dataset_id(db_sessionmaker) -> str:
    # Each row's first feature is its row number, so a sampled row names where it came from.
    def blocks():
        for chunk in range(N_CHUNKS):
            rows = np.arange(chunk * CHUNK_ROWS, (chunk + 1) * CHUNK_ROWS, dtype=np.float64)
            X = np.column_stack([rows, *(rows * j for j in range(2, N_FEATURES + 1))])
            yield X, -rows

    with session_scope(db_sessionmaker) as session:
        return dataset_store.create_dataset_from_blocks(
            session,
            blocks=blocks(),
            n_features=N_FEATURES,
            feature_names=None,
            target_name=None,
            name=None,
        ).id


def sample(db_sessionmaker, dataset_id: str, max_rows: int):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        assert dataset is not None
        tracemalloc.start()
        try:
            X, y = dataset_store.sample_dataset_rows(session, dataset=dataset, max_rows=max_rows)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return X, y, peak


def test_a_sample_reads_the_chunks_it_needs_and_no_more(db_sessionmaker, big_dataset_id):
    X, y, peak = sample(db_sessionmaker, big_dataset_id, 5000)

    assert X.shape == (5000, N_FEATURES) and y.shape == (5000,)
    row_numbers = X[:, 0].astype(np.int64)
    # Real rows, each once, in stored order, with their own features and target.
    assert np.all(np.diff(row_numbers) > 0)
    np.testing.assert_array_equal(X, np.column_stack([X[:, 0] * j for j in range(1, 5)]))
    np.testing.assert_array_equal(y, -X[:, 0])
    # Drawn from as few chunks as hold 5,000 rows (3 of 2,000), but at least 4, spread over
    # the dataset rather than taken from its start.
    chunks_read = np.unique(row_numbers // CHUNK_ROWS)
    assert len(chunks_read) == dataset_store.MIN_SAMPLED_CHUNKS
    assert chunks_read.max() - chunks_read.min() > N_CHUNKS // 4
    # Memory: a few chunks (64 kB of features each) and the sample, against the 16 MB that
    # reading the whole dataset costs.
    assert peak < 2 * 1024 * 1024, peak

    again_X, again_y, _ = sample(db_sessionmaker, big_dataset_id, 5000)
    np.testing.assert_array_equal(again_X, X)
    np.testing.assert_array_equal(again_y, y)


def test_a_sample_larger_than_a_few_chunks_reads_as_many_as_hold_it(
    db_sessionmaker, big_dataset_id
):
    X, _, _ = sample(db_sessionmaker, big_dataset_id, 9_001)
    chunks_read = np.unique(X[:, 0].astype(np.int64) // CHUNK_ROWS)
    # 9,001 rows need 5 chunks of 2,000; rows are drawn among them all, so each gives some.
    assert len(X) == 9_001 and len(chunks_read) == 5


def test_a_dataset_no_larger_than_the_sample_is_read_whole_in_order(
    db_sessionmaker, big_dataset_id
):
    with session_scope(db_sessionmaker) as session:
        small = dataset_store.create_dataset(
            session,
            X=np.arange(20.0).reshape(10, 2),
            y=np.arange(10.0),
            feature_names=None,
            target_name=None,
            name=None,
        )
        X, y = dataset_store.sample_dataset_rows(session, dataset=small, max_rows=10)
    np.testing.assert_array_equal(X, np.arange(20.0).reshape(10, 2))
    np.testing.assert_array_equal(y, np.arange(10.0))
