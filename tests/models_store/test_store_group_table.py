"""A grouped model's group table: labels, lines and (for EM) each group's posterior, stored in
one compressed ``.npz``; a table stored before posteriors were kept still loads."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update

from models_store import models as model_store
from models_store.codecs import decode_group_table, encode_group_table
from models_store.session import session_scope
from models_store.tables import Model


def posteriors_of(n_groups: int, k: int, seed: int = 0) -> np.ndarray:
    """Rows of a softmax: probabilities from near 0 to near 1, summing to one."""
    logits = 12.0 * np.random.default_rng(seed).standard_normal((n_groups, k))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def grouped_fields(dataset_id: str, labels: Any, posteriors: Any) -> dict[str, Any]:
    """A grouped EM model of 2 lines on the dataset's 2 features."""
    return {
        "job_id": None,
        "dataset_id": dataset_id,
        "name": None,
        "algorithm": "em",
        "n_components": 2,
        "n_features": 2,
        "feature_names": ["a", "b"],
        "fit_intercept": True,
        "params": {},
        "seed": 0,
        "coef": [[1.0, 0.5], [-1.0, 2.0]],
        "intercept": [0.0, 1.0],
        "shares": [0.5, 0.5],
        "train_min_loss": 0.1,
        "holdout_min_loss": None,
        "baseline": {"coef": [0.0, 0.0], "intercept": 0.0, "train_min_loss": 1.0},
        "n_train": 6,
        "n_holdout": 0,
        "loss_history": [0.1],
        "n_iter": 1,
        "fit_seconds": 0.1,
        "groups_column": "user",
        "group_labels": labels,
        "group_lines": np.argmax(posteriors, axis=1),
        "group_posteriors": posteriors,
    }


def test_group_posteriors_round_trip_through_the_store(db_sessionmaker, dataset_id):
    labels = np.array([f"user-{i:05d}" for i in range(10**4)])
    posteriors = posteriors_of(labels.size, 2)
    with session_scope(db_sessionmaker) as session:
        model_id = model_store.create_model(
            session, model_store.ModelRecord(**grouped_fields(dataset_id, labels, posteriors))
        ).id
    with session_scope(db_sessionmaker) as session:
        table = model_store.load_group_table(session, model_id=model_id)
        assert table is not None
        np.testing.assert_array_equal(table.labels, labels)
        np.testing.assert_array_equal(table.lines, np.argmax(posteriors, axis=1))
        assert table.posteriors is not None and table.posteriors.dtype == np.float64
        # Kept as float32: every probability within float32's rounding of the fitted one.
        np.testing.assert_allclose(table.posteriors, posteriors, rtol=2**-23, atol=1e-45)
        np.testing.assert_array_equal(table.posteriors, posteriors.astype(np.float32))
        stored = session.get(Model, model_id)
        assert stored is not None and stored.group_table is not None
        # 10^4 groups x 2 lines: about 8 bytes of posteriors per group at most, compressed.
        assert len(stored.group_table) < 10**4 * (8 + 8)


def test_a_table_stored_before_posteriors_were_kept_still_loads(db_sessionmaker, dataset_id):
    labels = np.array([-2.5, 3.0, 7.0])
    # The table as it was written before: labels and lines only.
    buffer = io.BytesIO()
    np.savez_compressed(buffer, labels=labels, lines=np.array([1, 0, 1], dtype=np.int16))
    with session_scope(db_sessionmaker) as session:
        model_id = model_store.create_model(
            session,
            model_store.ModelRecord(**grouped_fields(dataset_id, labels, posteriors_of(3, 2))),
        ).id
        session.execute(
            update(Model).where(Model.id == model_id).values(group_table=buffer.getvalue())
        )
    with session_scope(db_sessionmaker) as session:
        table = model_store.load_group_table(session, model_id=model_id)
        assert table is not None
        np.testing.assert_array_equal(table.labels, labels)
        np.testing.assert_array_equal(table.lines, [1, 0, 1])
        assert table.posteriors is None


def test_a_table_without_posteriors_decodes_with_none():
    table = decode_group_table(encode_group_table(["a", "b"], [0, 1]))
    assert table.labels.tolist() == ["a", "b"] and table.lines.tolist() == [0, 1]
    assert table.posteriors is None


@pytest.mark.parametrize(
    "posteriors", [np.full((3, 2), 0.5), np.full(2, 0.5), np.full((2, 2, 1), 0.5)]
)
def test_posteriors_need_one_row_per_group(posteriors):
    with pytest.raises(ValueError, match="one row per group"):
        encode_group_table(["a", "b"], [0, 1], posteriors)
