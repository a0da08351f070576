"""The HTTP interface in-process: upload, fit, jobs, models, predict, health and metrics."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions, predict_lines
from models_store import migrate


def upload_json(client, X, y, **extra) -> dict:
    response = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist(), **extra})
    assert response.status_code == 201, response.text
    assert response.headers["location"] == response.json()["url"]
    return response.json()


def test_json_dataset_upload_and_listing(client, data):
    X, y = data
    first = upload_json(client, X, y, feature_names=["u", "v"], name="first")
    second = upload_json(client, X[:5], y[:5])
    assert (first["n_rows"], first["n_features"]) == (20, 2)
    assert first["feature_names"] == ["u", "v"] and first["name"] == "first"
    assert second["feature_names"] == ["x0", "x1"]
    assert client.get(first["url"]).json() == first
    page = client.get("/datasets", params={"limit": 1}).json()
    assert page["total"] == 2 and page["limit"] == 1 and len(page["items"]) == 1
    assert page["items"][0]["id"] == second["id"]  # newest first
    assert client.get("/datasets", params={"offset": 1}).json()["items"][0]["id"] == first["id"]


def test_csv_upload_as_a_file_and_as_a_raw_body(client):
    content = b"height,weight,score\n1.5,60,3\n1.7,72,4.5\n1.8,80,5\n"
    response = client.post(
        "/datasets",
        files={"file": ("people.csv", content, "text/csv")},
        data={"target": "score", "name": "people"},
    )
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["feature_names"] == ["height", "weight"]
    assert dataset["target_name"] == "score" and dataset["name"] == "people"
    assert dataset["n_rows"] == 3
    raw = client.post(
        "/datasets",
        params={"target": "weight"},
        content=content,
        headers={"content-type": "text/csv"},
    )
    assert raw.status_code == 201, raw.text
    assert raw.json()["feature_names"] == ["height", "score"]


def test_npz_upload(client):
    buffer = io.BytesIO()
    np.savez(buffer, X=np.ones((4, 3)), y=np.arange(4.0))
    response = client.post("/datasets", files={"file": ("data.npz", buffer.getvalue())})
    assert response.status_code == 201, response.text
    assert response.json()["n_features"] == 3


def test_fit_a_stored_dataset_queues_a_job(client, data, count_rows):
    X, y = data
    dataset = upload_json(client, X, y)
    response = client.post(
        "/fit", json={"dataset_id": dataset["id"], "k": 2, "name": "try", "seed": 4}
    )
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["status"] == "queued"
    assert response.headers["location"] == accepted["url"] == f"/jobs/{accepted['job_id']}"
    job = client.get(accepted["url"]).json()
    assert job["dataset_id"] == dataset["id"]
    assert job["algorithm"] == "auto" and job["n_components"] == 2
    assert job["params"]["n_partitions"] == 1000
    # The size-aware default of n_init is resolved for the 16 training rows.
    n_init = MixtureOfLinearRegressions(2, random_state=4).resolved_parameters(16, 2)["n_init"]
    assert job["params"]["n_init"] == n_init >= 1
    assert (job["attempts"], job["max_attempts"], job["seed"]) == (0, 3, 4)
    assert job["progress"] == {
        "fraction": 0.0,
        "iteration": None,
        "candidates_tried": None,
        "best_min_loss": None,
        "n_components": None,
        "keys_done": None,
        "n_keys": None,
    }
    assert (job["k_values"], job["sweep"], job["warnings"]) == (None, None, [])
    assert count_rows() == {"datasets": 1, "jobs": 1, "models": 0}


def test_inline_data_is_stored_as_a_dataset(client, data, count_rows):
    X, y = data
    response = client.post(
        "/fit", json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "name": "inline"}
    )
    job = client.get(response.json()["url"]).json()
    dataset = client.get(f"/datasets/{job['dataset_id']}").json()
    assert (dataset["n_rows"], dataset["name"]) == (20, "inline")
    assert count_rows() == {"datasets": 1, "jobs": 1, "models": 0}


def test_idempotent_retry_returns_the_same_job(client, data, count_rows):
    X, y = data
    body = {"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2}
    headers = {"Idempotency-Key": "abc"}
    first = client.post("/fit", json=body, headers=headers)
    # The same request with its defaults spelled out.
    explicit = {"data": body["data"], "n_components": 2, "algorithm": "auto", "seed": 0}
    retry = client.post("/fit", json=explicit, headers=headers)
    assert first.status_code == retry.status_code == 202
    assert retry.json()["job_id"] == first.json()["job_id"]
    assert retry.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert count_rows() == {"datasets": 1, "jobs": 1, "models": 0}


def test_jobs_list_filters_by_status_and_pages(client, data):
    X, y = data
    dataset = upload_json(client, X, y)
    ids = [
        client.post("/fit", json={"dataset_id": dataset["id"], "k": 1, "seed": seed}).json()[
            "job_id"
        ]
        for seed in range(3)
    ]
    cancelled = client.post(f"/jobs/{ids[0]}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    queued = client.get("/jobs", params={"status": "queued"}).json()
    assert queued["total"] == 2
    assert [job["id"] for job in queued["items"]] == [ids[2], ids[1]]
    page = client.get("/jobs", params={"limit": 2, "offset": 2}).json()
    assert page["total"] == 3 and [job["id"] for job in page["items"]] == [ids[0]]


def test_a_fitted_model_record(client, model_id):
    model = client.get(f"/models/{model_id}").json()
    assert model["algorithm"] == "am" and model["n_components"] == 2
    assert len(model["components"]) == 2
    assert all(len(component["coef"]) == 2 for component in model["components"])
    assert sum(component["share"] for component in model["components"]) == pytest.approx(1)
    assert (model["n_train"], model["n_holdout"]) == (16, 4)
    assert model["params"]["n_init"] == 3 and model["seed"] == 1
    assert set(model["baseline"]) == {"coef", "intercept", "train_min_loss", "holdout_min_loss"}
    assert model["train_min_loss"] <= model["baseline"]["train_min_loss"]
    assert model["n_iter"] >= 1 and model["loss_history"]
    assert model["fit_seconds"] > 0
    job = client.get(f"/jobs/{model['job_id']}").json()
    assert job["status"] == "succeeded" and job["model_url"] == f"/models/{model_id}"
    listed = client.get("/models").json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == model_id


def test_predict_returns_k_values_per_row_and_scores_with_y(client, model_id, data):
    X, y = data
    model = client.get(f"/models/{model_id}").json()
    coef = np.array([component["coef"] for component in model["components"]])
    intercept = np.array([component["intercept"] for component in model["components"]])
    expected = predict_lines(X, coef, intercept)

    plain = client.post("/predict", json={"model_id": model_id, "X": X.tolist()}).json()
    assert plain == {"model_id": model_id, "predictions": expected.tolist()}

    scored = client.post(f"/models/{model_id}/predict", json={"X": X.tolist(), "y": y.tolist()})
    body = scored.json()
    errors = (y[:, None] - expected) ** 2
    assert body["predictions"] == expected.tolist()
    assert body["best_component"] == np.argmin(errors, axis=1).tolist()
    assert body["min_loss"] == pytest.approx(errors.min(axis=1).mean(), rel=1e-15)


def test_delete_a_model(client, model_id, data):
    X, _ = data
    assert client.post(f"/models/{model_id}/predict", json={"X": X.tolist()}).status_code == 200
    assert model_id in client.app.state.model_cache
    response = client.delete(f"/models/{model_id}")
    assert response.status_code == 204 and response.content == b""
    assert model_id not in client.app.state.model_cache
    assert client.post(f"/models/{model_id}/predict", json={"X": X.tolist()}).status_code == 404
    assert client.get(f"/models/{model_id}").status_code == 404
    jobs = client.get("/jobs").json()["items"]
    assert jobs[0]["model_id"] == model_id  # the job keeps its history


def test_cancel_of_a_finished_job_is_409(client, model_id):
    job_id = client.get(f"/models/{model_id}").json()["job_id"]
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.status_code == 409
    assert response.json()["detail"] == f"job {job_id} already finished with status succeeded"


def test_health_readiness_and_docs(client, settings):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "database_revision": migrate.head_revision(),
        "worker": "embedded",
        "queue": None,
    }
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()

    migrate.downgrade(settings.database_url)
    not_ready = client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.headers["content-type"] == "application/problem+json"
    assert not_ready.json()["detail"] == (
        f"the database schema is at revision None, not at head {migrate.head_revision()}; "
        "run `mixreg db upgrade`"
    )
    migrate.upgrade(settings.database_url)


def test_metrics_count_requests_by_route_and_jobs_by_status(client, data):
    X, y = data
    dataset = upload_json(client, X, y)
    job_id = client.post("/fit", json={"dataset_id": dataset["id"], "k": 1}).json()["job_id"]
    client.get(f"/jobs/{job_id}")
    client.get("/jobs/unknown")
    text = client.get("/metrics").text
    assert (
        'mixreg_http_requests_total{method="GET",route="/jobs/{job_id}",status="200"} 1.0' in text
    )
    assert (
        'mixreg_http_requests_total{method="GET",route="/jobs/{job_id}",status="404"} 1.0' in text
    )
    assert 'mixreg_jobs{status="queued"} 1.0' in text
    assert 'mixreg_jobs{status="running"} 0.0' in text
    assert "mixreg_http_request_duration_seconds_bucket" in text
