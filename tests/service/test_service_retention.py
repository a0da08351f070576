"""Deleting datasets, fits that do not keep their data, and the retention the workers run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from models_store.session import session_scope
from models_store.tables import DatasetChunk
from service.config import Settings, SettingsError, load_settings
from service.jobs.retention import apply_retention


def chunks_of(app_sessionmaker, dataset_id: str) -> int:
    with session_scope(app_sessionmaker) as session:
        return (
            session.scalar(select(func.count()).where(DatasetChunk.dataset_id == dataset_id)) or 0
        )


def upload(client, X, y) -> str:
    response = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist()})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def fit(client, **body) -> str:
    response = client.post("/fit", json={"k": 2, "algorithm": "am-classic", **body})
    assert response.status_code == 202, response.text
    return str(response.json()["job_id"])


def test_a_dataset_in_use_is_kept_and_an_unused_one_deleted_with_its_rows(
    client, data, app_sessionmaker, run_queued_jobs
):
    X, y = data
    dataset_id = upload(client, X, y)
    job_id = fit(client, dataset_id=dataset_id)  # stays queued: no worker runs in this app
    assert chunks_of(app_sessionmaker, dataset_id) > 0
    refused = client.delete(f"/datasets/{dataset_id}")
    assert refused.status_code == 409
    assert refused.headers["content-type"] == "application/problem+json"
    assert f"used by 1 queued or running job ({job_id})" in refused.json()["detail"]
    assert run_queued_jobs() == ["succeeded"]
    model_id = client.get(f"/jobs/{job_id}").json()["model_id"]

    assert client.delete(f"/datasets/{dataset_id}").status_code == 204
    assert chunks_of(app_sessionmaker, dataset_id) == 0
    assert client.get(f"/datasets/{dataset_id}").status_code == 404
    assert client.delete(f"/datasets/{dataset_id}").status_code == 404
    # What was fitted on it keeps its id as provenance, and still predicts.
    assert client.get(f"/jobs/{job_id}").json()["dataset_id"] == dataset_id
    assert client.get(f"/models/{model_id}").json()["dataset_id"] == dataset_id
    assert client.post(f"/models/{model_id}/predict", json={"X": X[:2].tolist()}).status_code == 200
    gone = client.post("/fit", json={"k": 2, "dataset_id": dataset_id})
    assert gone.status_code == 404


def test_a_cancelled_fit_no_longer_holds_its_dataset(client, data, app_sessionmaker):
    X, y = data
    dataset_id = upload(client, X, y)
    job_id = fit(client, dataset_id=dataset_id)
    assert client.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert client.delete(f"/datasets/{dataset_id}").status_code == 204


def test_a_fit_told_not_to_keep_its_data_deletes_it_when_done(
    client, data, app_sessionmaker, run_queued_jobs
):
    X, y = data
    job_id = fit(client, data={"X": X.tolist(), "y": y.tolist()}, keep_data=False)
    dataset_id = client.get(f"/jobs/{job_id}").json()["dataset_id"]
    assert chunks_of(app_sessionmaker, dataset_id) > 0  # the queued fit still needs it
    assert run_queued_jobs() == ["succeeded"]
    assert chunks_of(app_sessionmaker, dataset_id) == 0
    assert client.get(f"/datasets/{dataset_id}").status_code == 404
    model_id = client.get(f"/jobs/{job_id}").json()["model_id"]
    assert client.get(f"/models/{model_id}").status_code == 200
    kept = fit(client, data={"X": X.tolist(), "y": y.tolist()})
    assert run_queued_jobs() == ["succeeded"]
    assert (
        client.get(f"/datasets/{client.get(f'/jobs/{kept}').json()['dataset_id']}").status_code
        == 200
    )


def test_keep_data_false_applies_to_inline_data_only(client, data):
    X, y = data
    dataset_id = upload(client, X, y)
    response = client.post("/fit", json={"k": 2, "dataset_id": dataset_id, "keep_data": False})
    assert response.status_code == 422
    assert "keep_data: false applies to inline data" in response.json()["detail"]


def test_retention_deletes_old_jobs_models_not_behind_an_alias_and_unused_datasets(
    client, data, app_sessionmaker, run_queued_jobs, settings
):
    X, y = data
    served_data = upload(client, X, y)
    fit(client, dataset_id=served_data, registered_model="reco")
    fit(client, dataset_id=served_data, registered_model="reco")
    other_data = upload(client, X[:10], y[:10])
    fit(client, dataset_id=other_data)
    unused = upload(client, X, y)
    assert run_queued_jobs() == ["succeeded"] * 3
    assert (
        client.put("/registered-models/reco/aliases/production", json={"version": 2}).status_code
        == 200
    )
    served = client.get("/models/reco@production").json()["id"]
    queued = fit(client, dataset_id=unused)  # a queued job keeps its dataset

    keep_all = apply_retention(app_sessionmaker, settings, now=datetime.now(UTC))
    assert (keep_all.expired_jobs, keep_all.expired_models, keep_all.expired_datasets) == (
        0,
        [],
        [],
    )
    later = datetime.now(UTC) + timedelta(days=2)
    expiring = settings.model_copy(
        update={"job_retention_days": 1, "model_retention_days": 1, "dataset_retention_days": 1}
    )
    report = apply_retention(app_sessionmaker, expiring, now=later)
    assert report.expired_jobs == 3
    assert len(report.expired_models) == 2 and served not in report.expired_models
    # The served model's dataset stays; the other model's went with it; the queued job's stays.
    assert report.expired_datasets == [other_data]
    assert [item["id"] for item in client.get("/models").json()["items"]] == [served]
    assert [item["id"] for item in client.get("/jobs").json()["items"]] == [queued]
    assert client.get("/registered-models/reco/versions").json()["items"][0]["version"] == 2
    for dataset_id, status in ((served_data, 200), (other_data, 404), (unused, 200)):
        assert client.get(f"/datasets/{dataset_id}").status_code == status


@pytest.mark.parametrize("variable", ["MIXREG_JOB_RETENTION_DAYS", "MIXREG_MODEL_RETENTION_DAYS"])
def test_retention_settings_must_not_be_negative(variable, monkeypatch):
    monkeypatch.setenv(variable, "-1")
    with pytest.raises(SettingsError, match=variable):
        load_settings()


def test_retention_is_off_by_default():
    defaults = Settings()
    assert (
        defaults.job_retention_days,
        defaults.model_retention_days,
        defaults.dataset_retention_days,
    ) == (None, None, None)
