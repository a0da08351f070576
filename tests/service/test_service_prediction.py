"""Predictions from stored numbers, the model cache, and overflow."""

from __future__ import annotations

import numpy as np
import pytest

from models_store import datasets as dataset_store
from models_store import models as model_store
from models_store.session import session_scope
from service.errors import InvalidInputError, NotFoundError
from service.serving.prediction import ModelCache, StoredLines, delete_model, load_lines, predict


def lines(model_id: str = "m", coef=((1.0, 2.0), (-1.0, 0.5)), intercept=(0.0, 1.0)):
    return StoredLines(model_id, np.array(coef, dtype=float), np.array(intercept, dtype=float))


def test_predict_gives_one_value_per_line_and_scores_with_y():
    response = predict(lines(), [[1.0, 1.0], [2.0, 0.0]], [3.0, -1.0])
    assert response.predictions == [[3.0, 0.5], [2.0, -1.0]]
    assert response.best_component == [0, 1]
    assert response.min_loss == 0.0
    assert predict(lines(), [[0.0, 0.0]]).min_loss is None


def test_predict_checks_the_feature_count():
    with pytest.raises(InvalidInputError, match=r"^model m expects 2 features, got 1$"):
        predict(lines(), [[1.0]])


def test_overflowing_predictions_are_refused():
    with pytest.raises(InvalidInputError) as error:
        predict(lines(), [[1.0, 1.0], [1e308, 1e308]])
    assert str(error.value) == (
        "the prediction of component 0 for X row 1 overflows a float64; scale X down"
    )
    with pytest.raises(InvalidInputError, match=r"min-loss of these predictions overflows"):
        predict(lines(), [[1.0, 1.0]], [1e300])


def test_the_cache_is_least_recently_used():
    cache = ModelCache(capacity=2)
    for name in ("a", "b"):
        cache.put(lines(name))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put(lines("c"))
    assert "b" not in cache and "a" in cache and "c" in cache
    cache.evict("a")
    assert cache.get("a") is None


class _NoDatabase:
    """A session factory that fails the test if it is used."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("the database was used")

    begin = __call__


def test_load_lines_reads_the_database_once(db_sessionmaker):
    coef = np.array([[0.1, 0.2], [0.3, 0.4]]) / 3
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.ones((2, 2)),
            y=np.ones(2),
            feature_names=None,
            target_name=None,
            name=None,
        )
        model = model_store.create_model(
            session,
            model_store.ModelRecord(
                job_id=None,
                dataset_id=dataset.id,
                name=None,
                algorithm="am",
                n_components=2,
                n_features=2,
                feature_names=["a", "b"],
                fit_intercept=True,
                params={},
                seed=0,
                coef=coef,
                intercept=[1 / 7, 2 / 7],
                shares=[0.5, 0.5],
                train_min_loss=1.0,
                holdout_min_loss=None,
                baseline={
                    "coef": [0.0, 0.0],
                    "intercept": 0.0,
                    "train_min_loss": 1.0,
                    "holdout_min_loss": None,
                },
                n_train=2,
                n_holdout=0,
                loss_history=[1.0],
                n_iter=1,
                fit_seconds=0.1,
            ),
        )
        model_id = model.id
    cache = ModelCache(capacity=4)
    loaded = load_lines(cache=cache, session_factory=db_sessionmaker, model_id=model_id)
    np.testing.assert_array_equal(loaded.coef, coef)  # bit for bit through the database
    np.testing.assert_array_equal(loaded.intercept, [1 / 7, 2 / 7])
    hit = load_lines(cache=cache, session_factory=_NoDatabase(), model_id=model_id)
    assert hit is loaded

    delete_model(cache=cache, session_factory=db_sessionmaker, reference=model_id)
    assert model_id not in cache
    with pytest.raises(NotFoundError, match=f"^model {model_id} does not exist$"):
        load_lines(cache=cache, session_factory=db_sessionmaker, model_id=model_id)
    with pytest.raises(NotFoundError):
        delete_model(cache=cache, session_factory=db_sessionmaker, reference=model_id)
