"""Datasets in row chunks: written block by block, read back in order bit for bit, and moved
into chunks (and back) by revision 0004 without losing a value."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sqlalchemy import select, text

from models_store import datasets as dataset_store
from models_store import migrate
from models_store.session import make_engine, make_sessionmaker, session_scope
from models_store.tables import DatasetChunk


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def awkward(n_rows: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, n_features)) * 10.0 ** rng.integers(-100, 100, (n_rows, 1))
    X[0, 0], X[-1, -1] = -0.0, 5e-324
    return X, rng.standard_normal(n_rows)


def test_blocks_of_any_size_are_stored_as_chunks_and_read_back_in_order(db_sessionmaker):
    X, y = awkward(1000, 3)
    sizes = [1, 499, 0, 250, 250]
    starts = np.cumsum([0, *sizes])
    blocks = [(X[a:b], y[a:b]) for a, b in itertools.pairwise(starts)]
    with session_scope(db_sessionmaker) as session:
        dataset_id = dataset_store.create_dataset_from_blocks(
            session,
            blocks=iter(blocks),
            n_features=3,
            feature_names=["a", "b", "c"],
            target_name="t",
            name="blocks",
        ).id
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        assert (dataset.n_rows, dataset.n_features) == (1000, 3)
        chunk_rows = session.scalars(
            select(DatasetChunk.n_rows)
            .where(DatasetChunk.dataset_id == dataset_id)
            .order_by(DatasetChunk.position)
        ).all()
        assert chunk_rows == [1, 499, 250, 250]  # an empty block stores nothing
        read = list(dataset_store.iter_dataset_blocks(session, dataset=dataset))
        X_loaded, y_loaded = dataset_store.load_dataset_arrays(dataset)
    assert [len(block_y) for _, block_y in read] == [1, 499, 250, 250]
    np.testing.assert_array_equal(bits(X_loaded), bits(X))
    np.testing.assert_array_equal(bits(y_loaded), bits(y))


def test_a_large_matrix_is_split_into_chunks_of_bounded_size(db_sessionmaker, monkeypatch):
    monkeypatch.setattr(dataset_store, "DATASET_CHUNK_BYTES", 8 * 4 * 100)  # 100 rows of 4
    X, y = awkward(1050, 4, seed=1)
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name=None, name=None
        )
        chunk_rows = session.scalars(
            select(DatasetChunk.n_rows).where(DatasetChunk.dataset_id == dataset.id)
        ).all()
        X_loaded, y_loaded = dataset_store.load_dataset_arrays(dataset)
    assert sorted(chunk_rows) == [50] + [100] * 10
    np.testing.assert_array_equal(bits(X_loaded), bits(X))
    np.testing.assert_array_equal(bits(y_loaded), bits(y))


def test_a_dataset_needs_a_row_and_blocks_that_fit_it(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        with pytest.raises(ValueError, match="at least one row"):
            dataset_store.create_dataset_from_blocks(
                session,
                blocks=iter([]),
                n_features=2,
                feature_names=None,
                target_name=None,
                name=None,
            )
        with pytest.raises(ValueError, match="must have 2 columns"):
            dataset_store.create_dataset_from_blocks(
                session,
                blocks=iter([(np.ones((2, 3)), np.ones(2))]),
                n_features=2,
                feature_names=None,
                target_name=None,
                name=None,
            )


def test_chunks_that_do_not_add_up_to_the_dataset_are_refused(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.ones((4, 2)),
            y=np.ones(4),
            feature_names=None,
            target_name=None,
            name=None,
        )
        dataset.n_rows = 5  # as if a chunk went missing
        session.flush()
        with pytest.raises(ValueError, match="has 5 rows but its chunks hold 4"):
            list(dataset_store.iter_dataset_blocks(session, dataset=dataset))


def test_datasets_stored_before_revision_0004_survive_its_upgrade_and_downgrade(database_url):
    migrate.upgrade(database_url, "0003")
    X, y = awkward(300, 5, seed=2)
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, name, n_rows, n_features, feature_names, x_data, "
                    "y_data, created_at) VALUES (:id, 'legacy', 300, 5, "
                    '\'["a", "b", "c", "d", "e"]\', :x, :y, :at)'
                ),
                {
                    "id": "d" * 32,
                    "x": X.astype("<f8").tobytes(),
                    "y": y.astype("<f8").tobytes(),
                    "at": "2030-01-01T12:00:00+00:00",
                },
            )
        migrate.upgrade(database_url)
        with session_scope(make_sessionmaker(engine)) as session:
            dataset = dataset_store.get_dataset(session, dataset_id="d" * 32)
            assert (dataset.name, dataset.n_rows, dataset.feature_names) == (
                "legacy",
                300,
                ["a", "b", "c", "d", "e"],
            )
            X_loaded, y_loaded = dataset_store.load_dataset_arrays(dataset)
        np.testing.assert_array_equal(bits(X_loaded), bits(X))
        np.testing.assert_array_equal(bits(y_loaded), bits(y))

        # A dataset stored at head in several chunks is joined into one value on the way down.
        with session_scope(make_sessionmaker(engine)) as session:
            chunked_id = dataset_store.create_dataset_from_blocks(
                session,
                blocks=iter([(X[:100], y[:100]), (X[100:], y[100:])]),
                n_features=5,
                feature_names=None,
                target_name=None,
                name="chunked",
            ).id
        engine.dispose()
        migrate.downgrade(database_url, "0003")
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT id, x_data, y_data FROM datasets ORDER BY name DESC")
            ).all()
        assert [row.id for row in rows] == ["d" * 32, chunked_id]
        for row in rows:
            np.testing.assert_array_equal(np.frombuffer(bytes(row.x_data), "<f8"), X.ravel())
            np.testing.assert_array_equal(np.frombuffer(bytes(row.y_data), "<f8"), y)
    finally:
        engine.dispose()
