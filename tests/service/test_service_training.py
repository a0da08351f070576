"""Submitting and running fits as plain functions: submit_fit, fit_mixture, run_job."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from pydantic import TypeAdapter

from mixreg import MixtureOfLinearRegressions, min_loss
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store.session import session_scope
from service.errors import ConflictError, InvalidInputError, NotFoundError
from service.fit_schemas import FitRequest
from service.jobs.fit_spec import FitSpec, holdout_split
from service.jobs.fitting import fit_mixture
from service.jobs.submit import prepare_fit, submit_fit
from service.jobs.training import run_job

fit_request = TypeAdapter(FitRequest)


def request(**fields):
    return fit_request.validate_python(fields)


def test_holdout_split_is_a_seeded_partition():
    train, holdout = holdout_split(10, 0.3, seed=5)
    assert len(holdout) == 3 and len(train) == 7
    assert sorted(np.concatenate([train, holdout]).tolist()) == list(range(10))
    np.testing.assert_array_equal(holdout, np.sort(np.random.default_rng(5).permutation(10)[:3]))
    again, _ = holdout_split(10, 0.3, seed=5)
    np.testing.assert_array_equal(train, again)
    assert len(holdout_split(10, 0.0, seed=5)[1]) == 0


def test_fit_mixture_is_mixreg_on_the_training_rows(data):
    X, y = data
    spec = FitSpec(
        algorithm="em",
        n_components=2,
        params={"max_iter": 50},
        fit_intercept=True,
        holdout_fraction=0.25,
        seed=3,
        time_budget_s=None,
    )
    fitted = fit_mixture(X, y, spec)
    train, holdout = holdout_split(20, 0.25, seed=3)
    direct = MixtureOfLinearRegressions(2, "em", random_state=3, max_iter=50).fit(
        X[train], y[train]
    )
    np.testing.assert_array_equal(fitted.coef, direct.coef_)
    np.testing.assert_array_equal(fitted.intercept, direct.intercept_)
    np.testing.assert_array_equal(fitted.shares, direct.shares_)
    assert fitted.train_min_loss == direct.min_loss(X[train], y[train])
    assert fitted.holdout_min_loss == direct.min_loss(X[holdout], y[holdout])
    assert (fitted.n_train, fitted.n_holdout, fitted.n_iter) == (15, 5, direct.n_iter_)
    line = np.linalg.lstsq(np.c_[X[train], np.ones(15)], y[train], rcond=None)[0]
    np.testing.assert_allclose(fitted.baseline["coef"], line[:2], rtol=1e-10)
    np.testing.assert_allclose(fitted.baseline["intercept"], line[2], rtol=1e-10)
    residual = y[holdout] - X[holdout] @ line[:2] - line[2]
    assert fitted.baseline["holdout_min_loss"] == pytest.approx(np.mean(residual**2), rel=1e-10)


def test_fit_mixture_without_holdout_or_intercept(data):
    X, y = data
    spec = FitSpec(
        algorithm="am",
        n_components=2,
        params={},
        fit_intercept=False,
        holdout_fraction=0.0,
        seed=0,
        time_budget_s=None,
    )
    fitted = fit_mixture(X, y, spec)
    assert fitted.holdout_min_loss is None and fitted.baseline["holdout_min_loss"] is None
    assert fitted.baseline["intercept"] == 0.0
    np.testing.assert_array_equal(fitted.intercept, [0.0, 0.0])
    assert fitted.train_min_loss == min_loss(y, X @ fitted.coef.T)


def test_submit_fit_stores_inline_data_and_a_queued_job(db_sessionmaker, data):
    X, y = data
    with session_scope(db_sessionmaker) as session:
        submission = submit_fit(
            session,
            fit=prepare_fit(request(data={"X": X.tolist(), "y": y.tolist()}, k=2, algorithm="am")),
            idempotency_key=None,
            max_attempts=5,
            max_k_sweep=20,
        )
        job_id = submission.job.id
    assert submission.created
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        dataset = dataset_store.get_dataset(session, dataset_id=job.dataset_id)
        stored_X, stored_y = dataset_store.load_dataset_arrays(dataset)
        assert (job.status, job.max_attempts, job.params["step_size"]) == ("queued", 5, "auto")
    np.testing.assert_array_equal(stored_X, X)
    np.testing.assert_array_equal(stored_y, y)


def test_submit_fit_replays_and_conflicts_on_idempotency_keys(db_sessionmaker, data):
    X, y = data
    body = {"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2}
    with session_scope(db_sessionmaker) as session:
        first = submit_fit(
            session,
            fit=prepare_fit(request(**body)),
            idempotency_key="k1",
            max_attempts=3,
            max_k_sweep=20,
        )
        first_id = first.job.id
    with session_scope(db_sessionmaker) as session:
        again = submit_fit(
            session,
            fit=prepare_fit(request(**body)),
            idempotency_key="k1",
            max_attempts=3,
            max_k_sweep=20,
        )
        assert (again.job.id, again.created) == (first_id, False)
        with pytest.raises(ConflictError, match=r"Idempotency-Key 'k1' was already used"):
            submit_fit(
                session,
                fit=prepare_fit(request(**body, seed=2)),
                idempotency_key="k1",
                max_attempts=3,
                max_k_sweep=20,
            )
        assert job_store.list_jobs(session, status=None, limit=10, offset=0)[1] == 1


def test_submit_fit_checks_what_mixreg_would_reject(db_sessionmaker, data):
    X, y = data
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name=None, name=None
        )
        with pytest.raises(InvalidInputError, match=r"^k=17 is more than the 16 training rows"):
            submit_fit(
                session,
                fit=prepare_fit(request(dataset_id=dataset.id, k=17)),
                idempotency_key=None,
                max_attempts=3,
                max_k_sweep=20,
            )
        with pytest.raises(NotFoundError, match=r"^dataset nope does not exist$"):
            submit_fit(
                session,
                fit=prepare_fit(request(dataset_id="nope", k=1)),
                idempotency_key=None,
                max_attempts=3,
                max_k_sweep=20,
            )
        one_row = request(data={"X": [[1.0]], "y": [1.0]}, k=1, holdout_fraction=0.9)
        with pytest.raises(InvalidInputError, match=r"holdout_fraction=0\.9 holds out all 1 rows"):
            submit_fit(
                session,
                fit=prepare_fit(one_row),
                idempotency_key=None,
                max_attempts=3,
                max_k_sweep=20,
            )
        assert job_store.list_jobs(session, status=None, limit=1, offset=0)[1] == 0


def queue_and_claim(sessionmaker, data, **job_fields) -> str:
    X, y = data
    with session_scope(sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=["p", "q"], target_name="t", name=None
        )
        fields = {
            "algorithm": "am",
            "n_components": 2,
            "params": {},
            "fit_intercept": True,
            "holdout_fraction": 0.2,
            "max_attempts": 3,
            "seed": 0,
            **job_fields,
        }
        job_store.create_job(session, job_store.JobRecord(dataset_id=dataset.id, **fields))
    with session_scope(sessionmaker) as session:
        job = job_store.claim_next_job(session, worker_id="w1", now=datetime.now(UTC))
        return job.id


def test_run_job_stores_the_model_and_finishes_the_job(
    db_sessionmaker, migrated_database_url, data
):
    job_id = queue_and_claim(db_sessionmaker, data, name="named")
    assert run_job(job_id, migrated_database_url, worker_id="w1") == "succeeded"
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        model = model_store.get_model(session, model_id=job.model_id)
        assert (job.status, job.error, job.progress_fraction) == ("succeeded", None, 1.0)
        assert job.finished_at is not None
        assert (model.job_id, model.name, model.feature_names) == (job_id, "named", ["p", "q"])
        # The job named no parameters: the model records the defaults the fit ran with.
        assert model.params == {
            "step_size": "auto",
            "max_iter": 100,
            "tol": 1e-6,
            "n_init": 1,
            "init": None,
        }


def test_run_job_fails_the_job_with_mixregs_message(db_sessionmaker, migrated_database_url, data):
    job_id = queue_and_claim(db_sessionmaker, data, params={"step_size": -1.0})
    assert run_job(job_id, migrated_database_url) == "failed"
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job.error == "step_size must be > 0; got -1.0"
        assert job.model_id is None


def test_run_job_stops_when_cancel_was_requested(db_sessionmaker, migrated_database_url, data):
    job_id = queue_and_claim(db_sessionmaker, data)
    with session_scope(db_sessionmaker) as session:
        job_store.request_cancel(session, job_id=job_id)
    assert run_job(job_id, migrated_database_url, progress_interval_s=0) == "cancelled"
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job.status == "cancelled"
        assert model_store.list_models(session, limit=1, offset=0)[1] == 0


def test_run_job_leaves_a_job_of_another_worker_alone(db_sessionmaker, migrated_database_url, data):
    job_id = queue_and_claim(db_sessionmaker, data)
    assert run_job(job_id, migrated_database_url, worker_id="someone-else") == "lost"
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert (job.status, job.worker_id) == ("running", "w1")


def min_loss_on_rows(X, y, rows, coef, intercept):
    """Mean over ``rows`` of the smallest squared error of any line, written out in numpy."""
    predictions = X[rows] @ np.asarray(coef).T + np.asarray(intercept)
    return float(np.mean(np.min((predictions - y[rows, None]) ** 2, axis=1)))


def test_the_stored_holdout_loss_is_scored_on_exactly_the_holdout_rows(
    db_sessionmaker, migrated_database_url, noisy_data
):
    X, y = noisy_data
    job_id = queue_and_claim(
        db_sessionmaker, noisy_data, algorithm="em", holdout_fraction=0.3, seed=1
    )
    assert run_job(job_id, migrated_database_url, worker_id="w1") == "succeeded"
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        model = model_store.get_model(session, model_id=job.model_id)

    train, holdout = holdout_split(len(y), 0.3, seed=1)
    assert (model.n_train, model.n_holdout) == (len(train), len(holdout)) == (70, 30)
    train_loss = min_loss_on_rows(X, y, train, model.coef, model.intercept)
    holdout_loss = min_loss_on_rows(X, y, holdout, model.coef, model.intercept)
    # The two splits score measurably apart, so a loss taken on the wrong rows shows.
    assert abs(holdout_loss - train_loss) > 0.1 * train_loss
    assert model.train_min_loss == pytest.approx(train_loss, rel=1e-12)
    assert model.holdout_min_loss == pytest.approx(holdout_loss, rel=1e-12)

    baseline = model.baseline
    line_coef, line_intercept = [baseline["coef"]], [baseline["intercept"]]
    baseline_train = min_loss_on_rows(X, y, train, line_coef, line_intercept)
    baseline_holdout = min_loss_on_rows(X, y, holdout, line_coef, line_intercept)
    assert abs(baseline_holdout - baseline_train) > 0.1 * baseline_train
    assert baseline["train_min_loss"] == pytest.approx(baseline_train, rel=1e-12)
    assert baseline["holdout_min_loss"] == pytest.approx(baseline_holdout, rel=1e-12)
