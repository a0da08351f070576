"""A keyed job's shard reads only its rows: the plan's row indices survive their encoding, and
the rows are read from the chunks that hold them, one chunk at a time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sqlalchemy import event

from models_store import datasets as dataset_store
from models_store import shards as shard_store
from models_store.session import session_scope

N_FEATURES = 3
CHUNK_ROWS = 500
N_CHUNKS = 200  # 100,000 rows


@pytest.mark.parametrize(
    "rows",
    [
        np.arange(10, 5000),  # one run
        np.concatenate([np.arange(0, 7), np.arange(100, 300), np.arange(900, 901)]),
        np.sort(np.random.default_rng(0).choice(10**6, size=2000, replace=False)),
        np.array([3, 2**33]),  # beyond 32 bits
        np.zeros(0, dtype=np.int64),
    ],
)
def test_row_indices_survive_their_encoding(rows):
    decoded = shard_store.decode_rows(shard_store.encode_rows(rows.astype(np.int64)))
    assert decoded.dtype == np.int64
    np.testing.assert_array_equal(decoded, rows)


def test_runs_are_stored_in_less_than_their_rows():
    rows = np.arange(0, 200_000, dtype=np.int64)
    assert len(shard_store.encode_rows(rows)) < 2_000
    scattered = np.arange(0, 400_000, 2, dtype=np.int64)
    # Scattered rows: 4 bytes each (and the .npz's own few hundred bytes).
    assert len(shard_store.encode_rows(scattered)) < 4 * 200_000 + 1_000


@pytest.fixture
def accounts_id(db_sessionmaker, monkeypatch) -> str:
    monkeypatch.setattr(dataset_store, "DATASET_CHUNK_BYTES", 8 * N_FEATURES * CHUNK_ROWS)
    n_rows = CHUNK_ROWS * N_CHUNKS
    rows = np.arange(n_rows, dtype=np.float64)
    # Each row's features name it; the account of row i is i % 1000 (as text), so an
    # account's rows are spread over every chunk.
    X = np.column_stack([rows, 2 * rows, 3 * rows])
    account = np.array([f"a{i % 1000}" for i in range(n_rows)], dtype=object)
    with session_scope(db_sessionmaker) as session:
        return dataset_store.create_dataset(
            session,
            X=X,
            y=-rows,
            feature_names=None,
            target_name=None,
            name=None,
            extra={"account": account},
        ).id


def read(db_sessionmaker, dataset_id: str, rows: np.ndarray):
    chunks_fetched = []
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        assert dataset is not None

        def count(conn, cursor, statement, parameters, context, executemany):
            if "dataset_chunks.x_data" in statement:
                chunks_fetched.append(statement)

        engine = session.get_bind()
        event.listen(engine, "before_cursor_execute", count)
        tracemalloc.start()
        try:
            X, y, keys = dataset_store.read_dataset_rows(
                session, dataset=dataset, rows=rows, column="account"
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            event.remove(engine, "before_cursor_execute", count)
    return X, y, keys, peak, len(chunks_fetched)


def test_a_shard_reads_its_rows_and_only_the_chunks_that_hold_them(db_sessionmaker, accounts_id):
    # Rows of 3 chunks out of 200 (the rows of keys next to each other in the upload).
    rows = np.concatenate([np.arange(1200, 1300), np.arange(50_000, 50_010), [99_999]])
    X, y, keys, peak, queries = read(db_sessionmaker, accounts_id, rows)
    np.testing.assert_array_equal(X[:, 0], rows)
    np.testing.assert_array_equal(X[:, 2], 3 * rows)
    np.testing.assert_array_equal(y, -rows)
    assert keys.tolist() == [f"a{row % 1000}" for row in rows]
    assert queries == 1
    # Three chunks of 12 kB of features each and their text, not the 2.4 MB of the dataset.
    assert peak < 400_000, peak


def test_a_shard_of_scattered_keys_holds_one_chunk_at_a_time(db_sessionmaker, accounts_id):
    # The rows of 10 accounts: 1,000 rows spread over every chunk.
    rows = np.flatnonzero(np.isin(np.arange(CHUNK_ROWS * N_CHUNKS) % 1000, np.arange(10)))
    X, _, keys, peak, _ = read(db_sessionmaker, accounts_id, rows)
    np.testing.assert_array_equal(X[:, 0], rows)
    assert sorted(set(keys.tolist())) == sorted(f"a{i}" for i in range(10))
    # Every chunk is read, one at a time: the rows asked for and about one chunk (12 kB of
    # features, 500 texts as Python objects), not the dataset.
    assert peak < 600_000, peak


def test_a_row_beyond_the_dataset_is_refused(db_sessionmaker, accounts_id):
    with pytest.raises(ValueError, match="has no row 100000"):
        read(db_sessionmaker, accounts_id, np.array([5, CHUNK_ROWS * N_CHUNKS]))
