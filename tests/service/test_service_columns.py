"""A request's extra columns checked against a stored dataset (a 422 naming the field and the
column) and loaded in row order, on a real SQLite file and PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest

from models_store import datasets as dataset_store
from models_store.session import session_scope
from service.data import columns
from service.errors import InvalidInputError

N_ROWS = 50


@pytest.fixture
def dataset_id(db_sessionmaker) -> str:
    rng = np.random.default_rng(0)
    with session_scope(db_sessionmaker) as session:
        return dataset_store.create_dataset(
            session,
            X=rng.standard_normal((N_ROWS, 2)),
            y=rng.standard_normal(N_ROWS),
            feature_names=None,
            target_name=None,
            name=None,
            extra={
                "user": np.array([f"u{i % 4}" for i in range(N_ROWS)], dtype=object),
                "weight": np.arange(N_ROWS, dtype=float),
            },
        ).id


def test_columns_of_the_right_types_are_checked_and_loaded(db_sessionmaker, dataset_id):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        wanted = {"groups": "user", "weights": "weight", "keys": "user"}
        types = columns.check_columns(dataset, wanted, {"weights": {columns.NUMBER}})
        assert types == {"groups": "string", "weights": "number", "keys": "string"}
        loaded = columns.load_columns(dataset, wanted)
    assert loaded["groups"].tolist() == [f"u{i % 4}" for i in range(N_ROWS)]
    assert loaded["keys"].tolist() == loaded["groups"].tolist()
    np.testing.assert_array_equal(loaded["weights"], np.arange(N_ROWS))


def test_a_missing_column_or_a_wrong_type_is_a_422_naming_field_and_column(
    db_sessionmaker, dataset_id
):
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        with pytest.raises(InvalidInputError) as caught:
            columns.check_columns(dataset, {"groups": "usr"})
        assert caught.value.slug == "invalid-input"  # answered as a 422
        assert caught.value.detail == (
            "groups names the column 'usr' which the dataset does not have; its extra columns "
            "are: user (string), weight (number)"
        )
        with pytest.raises(InvalidInputError) as caught:
            columns.check_columns(dataset, {"weights": "user"}, {"weights": {columns.NUMBER}})
        assert caught.value.detail == (
            "weights names 'user' which holds text; a number column is needed"
        )
        plain = dataset_store.create_dataset(
            session, X=np.eye(2), y=np.ones(2), feature_names=None, target_name=None, name=None
        )
        with pytest.raises(InvalidInputError, match="its extra columns are: none"):
            columns.check_columns(plain, {"groups": "user"})
