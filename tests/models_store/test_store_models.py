"""Fitted models: θ stored as JSON numbers that read back bit-exact; list, get, delete."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from models_store import jobs as job_store
from models_store import models as model_store
from models_store.session import session_scope
from models_store.tables import Model

AWKWARD = [0.1, -0.0, 5e-324, 1e-300, 1.7976931348623157e308, 2.2250738585072014e-308, 1 / 3]


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def model_fields(dataset_id: str, **overrides: Any) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    coef = rng.standard_normal((2, 3)) * 10.0 ** rng.integers(-200, 200, size=(2, 3))
    coef[0] = AWKWARD[:3]
    fields: dict[str, Any] = {
        "job_id": None,
        "dataset_id": dataset_id,
        "name": "m",
        "algorithm": "subsample+am",
        "n_components": 2,
        "n_features": 3,
        "feature_names": ["a", "b", "c"],
        "fit_intercept": True,
        "params": {"step_size": 0.1, "init": np.array([[0.1, 0.2, 0.3, 0.4]] * 2)},
        "seed": 2**40,
        "coef": coef,
        "intercept": np.array(AWKWARD[3:5]),
        "shares": np.array([0.7, 0.30000000000000004]),
        "train_min_loss": 0.1 + 0.2,
        "holdout_min_loss": None,
        "baseline": {
            "coef": np.array(AWKWARD[4:7]),
            "intercept": np.float64(-0.0),
            "train_min_loss": 1e-300,
            "holdout_min_loss": None,
        },
        "n_train": 80,
        "n_holdout": 0,
        "loss_history": np.array([3.0, 2.5, 2.4999999999999996]),
        "n_iter": 3,
        "fit_seconds": 0.125,
    }
    fields.update(overrides)
    return fields


def create_model(session: Session, dataset_id: str, **overrides: Any) -> Model:
    return model_store.create_model(
        session, model_store.ModelRecord(**model_fields(dataset_id, **overrides))
    )


def test_model_numbers_round_trip_bit_exact(db_sessionmaker, dataset_id):
    fields = model_fields(dataset_id)
    with session_scope(db_sessionmaker) as session:
        model_id = model_store.create_model(session, model_store.ModelRecord(**fields)).id

    with session_scope(db_sessionmaker) as session:
        model = model_store.get_model(session, model_id=model_id)
        assert model is not None
        np.testing.assert_array_equal(bits(model.coef), bits(fields["coef"]))
        np.testing.assert_array_equal(bits(model.intercept), bits(fields["intercept"]))
        np.testing.assert_array_equal(bits(model.shares), bits(fields["shares"]))
        np.testing.assert_array_equal(bits(model.loss_history), bits(fields["loss_history"]))
        np.testing.assert_array_equal(
            bits(model.baseline["coef"]), bits(fields["baseline"]["coef"])
        )
        assert np.signbit(model.baseline["intercept"])
        assert model.baseline["train_min_loss"] == 1e-300
        assert model.baseline["holdout_min_loss"] is None
        assert model.train_min_loss == 0.30000000000000004
        assert model.params["init"] == [[0.1, 0.2, 0.3, 0.4]] * 2
        assert model.seed == 2**40
        assert (model.n_components, model.n_features, model.feature_names) == (
            2,
            3,
            ["a", "b", "c"],
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"coef": np.ones((3, 3))}, r"coef must have shape \(2, 3\)"),
        ({"intercept": np.ones(3)}, r"intercept must have shape \(2,\)"),
        ({"shares": np.ones((2, 1))}, r"shares must have shape \(2,\)"),
        ({"feature_names": ["a"]}, "got 1 feature names for 3 features"),
        ({"coef": np.array([[np.nan, 0, 0], [0, 0, 0]])}, "non-finite"),
    ],
)
def test_create_model_refuses_inconsistent_numbers(db_sessionmaker, dataset_id, overrides, message):
    with session_scope(db_sessionmaker) as session:
        with pytest.raises(ValueError, match=message):
            create_model(session, dataset_id, **overrides)
        assert model_store.list_models(session, limit=10, offset=0) == ([], 0)


def test_list_models_pages_newest_first(db_sessionmaker, dataset_id):
    with session_scope(db_sessionmaker) as session:
        created = [create_model(session, dataset_id, name=f"m{i}").id for i in range(3)]
    with session_scope(db_sessionmaker) as session:
        page, total = model_store.list_models(session, limit=2, offset=0)
        assert ([m.id for m in page], total) == ([created[2], created[1]], 3)
        page, total = model_store.list_models(session, limit=2, offset=2)
        assert ([m.id for m in page], total) == ([created[0]], 3)


def test_delete_model_removes_it_and_leaves_the_job_reference(
    db_sessionmaker, dataset_id, make_job
):
    with session_scope(db_sessionmaker) as session:
        job = make_job(session)
        model = create_model(session, dataset_id, job_id=job.id)
        claimed = job_store.claim_next_job(session, worker_id="w", now=job.created_at)
        assert claimed is not None
        assert job_store.finish_job(
            session,
            job_id=job.id,
            worker_id="w",
            status="succeeded",
            model_id=model.id,
            now=job.created_at,
        )
        job_id, model_id = job.id, model.id

    with session_scope(db_sessionmaker) as session:
        assert model_store.get_model(session, model_id=model_id) is not None
        assert model_store.delete_model(session, model_id=model_id) is True
        assert model_store.get_model(session, model_id=model_id) is None
        assert model_store.delete_model(session, model_id=model_id) is False

    with session_scope(db_sessionmaker) as session:
        assert model_store.get_model(session, model_id=model_id) is None
        assert model_store.list_models(session, limit=10, offset=0) == ([], 0)
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None and job.model_id == model_id


def test_deleting_a_job_nulls_the_model_job_reference(db_sessionmaker, dataset_id, make_job):
    with session_scope(db_sessionmaker) as session:
        job = make_job(session)
        model_id = create_model(session, dataset_id, job_id=job.id).id
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job.id)
        session.delete(job)
    with session_scope(db_sessionmaker) as session:
        model = model_store.get_model(session, model_id=model_id)
        assert model is not None and model.job_id is None


def test_a_models_diagnostics_round_trip(db_sessionmaker, dataset_id):
    candidates = [
        {
            "source": "random",
            "min_loss_before": np.float64(2.5),
            "min_loss_after": 0.5,
            "seconds": 0.01,
            "n_iter": np.int64(4),
            "converged": True,
            "n_rows": 80,
        },
    ]
    with session_scope(db_sessionmaker) as session:
        plain_id = create_model(session, dataset_id).id
        model_id = create_model(
            session,
            dataset_id,
            converged=False,
            log_likelihood=-12.5,
            bic=np.float64(40.25),
            n_parameters=9,
            candidates=candidates,
            warnings=["stopped at max_iter=2 before converging"],
        ).id
    with session_scope(db_sessionmaker) as session:
        model = model_store.get_model(session, model_id=model_id)
        assert model is not None
        assert (model.converged, model.log_likelihood, model.bic, model.n_parameters) == (
            False,
            -12.5,
            40.25,
            9,
        )
        assert model.candidates == [
            {
                "source": "random",
                "min_loss_before": 2.5,
                "min_loss_after": 0.5,
                "seconds": 0.01,
                "n_iter": 4,
                "converged": True,
                "n_rows": 80,
            }
        ]
        assert model.warnings == ["stopped at max_iter=2 before converging"]
        plain = model_store.get_model(session, model_id=plain_id)
        assert plain is not None
        assert (plain.converged, plain.bic, plain.candidates, plain.warnings) == (
            None,
            None,
            None,
            [],
        )
