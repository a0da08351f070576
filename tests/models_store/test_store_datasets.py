"""Datasets: stored as raw float64 bytes, read back bit-exact, listed newest first."""

from __future__ import annotations

import numpy as np
import pytest

from models_store import datasets as dataset_store
from models_store.session import session_scope
from models_store.tables import Dataset


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def test_dataset_round_trips_bit_exact(db_sessionmaker):
    X = np.array([[0.1, -0.0, 5e-324], [1e-300, 1.7976931348623157e308, 1 / 3]])
    y = np.array([2.2250738585072014e-308, -7.5])
    with session_scope(db_sessionmaker) as session:
        dataset_id = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=["a", "b", "c"], target_name="t", name="awkward"
        ).id

    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        assert dataset is not None
        assert (dataset.n_rows, dataset.n_features) == (2, 3)
        assert (dataset.name, dataset.target_name) == ("awkward", "t")
        assert dataset.feature_names == ["a", "b", "c"]
        assert dataset.created_at.utcoffset() is not None
        X_loaded, y_loaded = dataset_store.load_dataset_arrays(dataset)
    np.testing.assert_array_equal(bits(X_loaded), bits(X))
    np.testing.assert_array_equal(bits(y_loaded), bits(y))


def test_feature_names_default_to_numbered_columns(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.ones((3, 2)),
            y=np.ones(3),
            feature_names=None,
            target_name=None,
            name=None,
        )
        assert dataset.feature_names == ["x0", "x1"]


@pytest.mark.parametrize(
    ("X", "y", "names", "message"),
    [
        (np.ones(3), np.ones(3), None, "X must be a 2-D matrix"),
        (np.ones((3, 2)), np.ones(4), None, r"y must have shape \(3,\)"),
        (np.array([[1.0, np.nan]]), np.ones(1), None, "finite"),
        (np.ones((3, 2)), np.ones(3), ["only-one"], "got 1 feature names for 2 features"),
    ],
)
def test_create_dataset_refuses_inconsistent_input(db_sessionmaker, X, y, names, message):
    with session_scope(db_sessionmaker) as session:
        with pytest.raises(ValueError, match=message):
            dataset_store.create_dataset(
                session, X=X, y=y, feature_names=names, target_name=None, name=None
            )
        assert session.query(Dataset).count() == 0


def test_get_unknown_dataset_is_none(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        assert dataset_store.get_dataset(session, dataset_id="0" * 32) is None


def test_list_datasets_pages_newest_first_with_total(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        created = [
            dataset_store.create_dataset(
                session,
                X=np.full((1, 1), float(i)),
                y=np.zeros(1),
                feature_names=None,
                target_name=None,
                name=f"d{i}",
            ).id
            for i in range(5)
        ]

    newest_first = list(reversed(created))
    with session_scope(db_sessionmaker) as session:
        first, total = dataset_store.list_datasets(session, limit=2, offset=0)
        assert total == 5
        assert [d.id for d in first] == newest_first[:2]
        middle, _ = dataset_store.list_datasets(session, limit=2, offset=2)
        assert [d.id for d in middle] == newest_first[2:4]
        last, total = dataset_store.list_datasets(session, limit=2, offset=4)
        assert ([d.id for d in last], total) == (newest_first[4:], 5)
        beyond, total = dataset_store.list_datasets(session, limit=2, offset=10)
        assert (beyond, total) == ([], 5)
        with pytest.raises(ValueError, match="non-negative"):
            dataset_store.list_datasets(session, limit=-1, offset=0)
