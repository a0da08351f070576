"""Cursor pagination: rows added while a client pages never make it skip or repeat one."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from models_store import models as model_store
from models_store.session import session_scope
from models_store.tables import Dataset


def add_dataset(client, X, y) -> str:
    response = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist()})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def add_job(client, X, y) -> str:
    response = client.post("/fit", json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2})
    assert response.status_code == 202, response.text
    return str(response.json()["job_id"])


def add_model(app_sessionmaker, dataset_id: str) -> str:
    with session_scope(app_sessionmaker) as session:
        return model_store.create_model(
            session,
            model_store.ModelRecord(
                job_id=None,
                dataset_id=dataset_id,
                name=None,
                algorithm="am",
                n_components=1,
                n_features=2,
                feature_names=["x0", "x1"],
                fit_intercept=True,
                params={},
                seed=0,
                coef=[[1.0, 2.0]],
                intercept=[0.5],
                shares=[1.0],
                train_min_loss=0.1,
                holdout_min_loss=None,
                baseline={"train_min_loss": 0.2, "holdout_min_loss": None},
                n_train=20,
                n_holdout=0,
                loss_history=[0.1],
                n_iter=1,
                fit_seconds=0.0,
            ),
        ).id


def read_all(client, path: str, add_one, *, limit: int = 2) -> list[str]:
    """Every id of ``path``, page after page by cursor, adding a row before each next page."""
    seen: list[str] = []
    page = client.get(path, params={"limit": limit}).json()
    while True:
        seen.extend(item["id"] for item in page["items"])
        if page["next_cursor"] is None:
            return seen
        add_one()
        page = client.get(path, params={"limit": limit, "cursor": page["next_cursor"]}).json()


@pytest.mark.parametrize("listed", ["datasets", "jobs", "models"])
def test_paging_while_rows_arrive_neither_skips_nor_repeats(client, data, app_sessionmaker, listed):
    X, y = data
    dataset_id = add_dataset(client, X, y)
    add = {
        "datasets": lambda: add_dataset(client, X, y),
        "jobs": lambda: add_job(client, X, y),
        "models": lambda: add_model(app_sessionmaker, dataset_id),
    }[listed]
    for _ in range(6):
        add()
    before = [
        item["id"] for item in client.get(f"/{listed}", params={"limit": 100}).json()["items"]
    ]
    assert read_all(client, f"/{listed}", add) == before
    # An offset would have shown the first page's items again as rows arrived.
    first = client.get(f"/{listed}", params={"limit": 2}).json()["items"]
    add()
    second = client.get(f"/{listed}", params={"limit": 2, "offset": 2}).json()["items"]
    assert first[-1]["id"] == second[0]["id"]


def test_rows_created_at_the_same_instant_are_paged_by_id(client, data, app_sessionmaker):
    X, y = data
    ids = [add_dataset(client, X, y) for _ in range(5)]
    instant = datetime(2030, 1, 1, tzinfo=UTC)
    with session_scope(app_sessionmaker) as session:
        for dataset_id in ids:
            session.get(Dataset, dataset_id).created_at = instant  # type: ignore[union-attr]
    assert read_all(client, "/datasets", lambda: None) == sorted(ids, reverse=True)


def test_the_versions_of_a_registered_model_page_by_cursor_while_fits_add_versions(
    client, data, run_queued_jobs
):
    X, y = data

    def add_version() -> None:
        body = {
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "registered_model": "reco",
        }
        assert client.post("/fit", json=body).status_code == 202
        run_queued_jobs()

    for _ in range(5):
        add_version()
    seen: list[int] = []
    page = client.get("/registered-models/reco/versions", params={"limit": 2}).json()
    while True:
        seen.extend(item["version"] for item in page["items"])
        if page["next_cursor"] is None:
            break
        add_version()
        page = client.get(
            "/registered-models/reco/versions", params={"limit": 2, "cursor": page["next_cursor"]}
        ).json()
    assert seen == [5, 4, 3, 2, 1]


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        ({"cursor": "not-a-cursor"}, "is not a cursor of this list"),
        ({"cursor": "WyJ4IiwieSJd"}, "is not a cursor of this list"),  # ["x","y"]
        ({"cursor": "WyIyMDMwLTAxLTAxIiwieSJd", "offset": 1}, "give cursor or offset, not both"),
    ],
)
def test_a_bad_cursor_is_refused(client, params, detail):
    response = client.get("/jobs", params=params)
    assert response.status_code == 422
    assert detail in response.json()["detail"]


def test_offset_paging_still_works_with_a_total(client, data):
    X, y = data
    ids = [add_dataset(client, X, y) for _ in range(3)]
    page = client.get("/datasets", params={"limit": 2, "offset": 1}).json()
    assert [item["id"] for item in page["items"]] == ids[::-1][1:]
    assert page["total"] == 3 and page["next_cursor"] is None


def _cursor(*key: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


@pytest.mark.parametrize("path", ["/jobs", "/datasets", "/models"])
@pytest.mark.parametrize(
    "created_at",
    [
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "2030-01-01T00:00:00",  # no time zone
    ],
)
def test_a_cursor_at_the_edge_of_the_calendar_is_refused(client, path, created_at):
    response = client.get(path, params={"cursor": _cursor(created_at, "x")})
    assert response.status_code == 422, response.text
    assert "cursor" in response.json()["detail"]


@pytest.mark.parametrize("path", ["versions", "alias-events"])
@pytest.mark.parametrize("key", [2**63, 2**70, -(2**63) - 1])
def test_a_cursor_beyond_64_bits_is_refused(client, data, run_queued_jobs, path, key):
    X, y = data
    body = {"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "registered_model": "reco"}
    assert client.post("/fit", json=body).status_code == 202
    run_queued_jobs()
    response = client.get(f"/registered-models/reco/{path}", params={"cursor": _cursor(key)})
    assert response.status_code == 422, response.text
    assert "cursor" in response.json()["detail"]
