"""Extra columns of a dataset: stored beside X and y chunk by chunk as Arrow IPC, read back
value for value (NaN and missing text included), and never read by the readers of X and y."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from models_store import datasets as dataset_store
from models_store.session import session_scope
from models_store.tables import DatasetChunk

TEXTS = np.array(["ünïcode ✓", "", None, "a,b;c", "x" * 300], dtype=object)


def _columns(n_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(n_rows)
    weight[::7] = np.nan
    return {
        "user": TEXTS[rng.integers(0, len(TEXTS), n_rows)],
        "weight": weight,
        "account": rng.integers(0, 10**12, n_rows),
    }


def _assert_same(loaded: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(loaded) == list(expected)
    for name, values in expected.items():
        if values.dtype == object:
            assert loaded[name].dtype == object
            assert loaded[name].tolist() == values.tolist()
        else:
            assert loaded[name].dtype == np.float64
            np.testing.assert_array_equal(loaded[name], values.astype(np.float64))


def test_extra_columns_round_trip_with_their_types(db_sessionmaker):
    n_rows = 257
    columns = _columns(n_rows)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((n_rows, 3)), rng.standard_normal(n_rows)
    with session_scope(db_sessionmaker) as session:
        dataset_id = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name="t", name=None, extra=columns
        ).id
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        assert dataset.extra_columns == [
            {"name": "user", "type": "string"},
            {"name": "weight", "type": "number"},
            {"name": "account", "type": "number"},
        ]
        loaded = dataset_store.load_dataset_columns(dataset, ["user", "weight", "account"])
        only_weight = dataset_store.load_dataset_columns(dataset, ["weight"])
        X_loaded, y_loaded = dataset_store.load_dataset_arrays(dataset)
    _assert_same(loaded, columns)
    _assert_same(only_weight, {"weight": columns["weight"]})
    np.testing.assert_array_equal(X_loaded, X)
    np.testing.assert_array_equal(y_loaded, y)


def test_chunks_with_text_stay_bounded_in_bytes_and_read_back_in_order(
    db_sessionmaker, monkeypatch
):
    budget = 4_000
    monkeypatch.setattr(dataset_store, "DATASET_CHUNK_BYTES", budget)
    n_rows = 600
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 120, n_rows)
    texts = np.array(["é" * int(length) for length in lengths], dtype=object)  # 2 bytes each
    X, y = rng.standard_normal((n_rows, 2)), rng.standard_normal(n_rows)
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=X,
            y=y,
            feature_names=None,
            target_name=None,
            name=None,
            extra={"note": texts},
        )
        dataset_id = dataset.id
    row_bytes = 8 * 2 + 2 * lengths
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        chunk_rows = session.scalars(
            select(DatasetChunk.n_rows)
            .where(DatasetChunk.dataset_id == dataset_id)
            .order_by(DatasetChunk.position)
        ).all()
        blocks = list(dataset_store.iter_dataset_columns(session, dataset=dataset, names=["note"]))
        X_blocks = list(dataset_store.iter_dataset_blocks(session, dataset=dataset))
    assert len(chunk_rows) > 5
    stops = np.cumsum(chunk_rows)
    starts = stops - chunk_rows
    for start, stop in zip(starts, stops, strict=True):
        # Within the budget, and the next row would not have fit (greedy).
        assert row_bytes[start:stop].sum() <= budget or stop - start == 1
        if stop < n_rows:
            assert row_bytes[start : stop + 1].sum() > budget
    assert [len(block["note"]) for block in blocks] == chunk_rows
    assert np.concatenate([block["note"] for block in blocks]).tolist() == texts.tolist()
    np.testing.assert_array_equal(np.concatenate([block[1] for block in X_blocks]), y)


def test_a_dataset_without_extra_columns_stores_no_extra_data(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=np.eye(3), y=np.ones(3), feature_names=None, target_name=None, name=None
        )
        assert dataset.extra_columns == []
        assert session.scalars(
            select(DatasetChunk.extra_data).where(DatasetChunk.dataset_id == dataset.id)
        ).all() == [None]
        assert dataset_store.load_dataset_columns(dataset, []) == {}
        with pytest.raises(KeyError, match="no extra column 'user'"):
            dataset_store.load_dataset_columns(dataset, ["user"])


def test_a_chunk_must_bring_every_extra_column(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.start_dataset(
            session,
            n_features=1,
            feature_names=["a"],
            target_name="t",
            name=None,
            extra_columns=[{"name": "g", "type": "string"}],
        )
        with pytest.raises(ValueError, match="extra columns must be"):
            dataset_store.add_dataset_chunk(
                session, dataset=dataset, X=np.ones((2, 1)), y=np.ones(2)
            )
        with pytest.raises(ValueError, match="must be new and distinct"):
            dataset_store.start_dataset(
                session,
                n_features=1,
                feature_names=["a"],
                target_name="t",
                name=None,
                extra_columns=[{"name": "a", "type": "number"}],
            )
