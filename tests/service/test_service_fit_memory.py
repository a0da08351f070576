"""Fits whose standard errors or gate need matrices larger than a fit process may hold are
refused when submitted, naming the product and the setting; smaller ones are queued."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL


def _dataset(client: TestClient, n_rows: int, n_features: int) -> str:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n_rows, n_features))
    response = client.post("/datasets", json={"X": X.tolist(), "y": X[:, 0].tolist()})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.parametrize(
    ("fields", "field", "product"),
    [
        (
            {"standard_errors": True},
            "standard_errors",
            # 40 x (1000 + 2) + 39 parameters: 10 matrices of 40,119², 119.9 GiB.
            "information matrix of 40,119 parameters: 10 x 40,119² x 8 bytes = 119.9 GiB",
        ),
        ({"n_bootstrap": 10}, "n_bootstrap", "information matrix of 40,119 parameters"),
        (
            {"gating": "features"},
            "gating",
            "a gate of k=40 classes on 1000 columns has 39,039 free parameters",
        ),
    ],
)
def test_a_fit_whose_matrices_cannot_fit_is_refused(client, count_rows, fields, field, product):
    dataset_id = _dataset(client, 60, 1000)
    before = count_rows()
    response = client.post(
        "/fit", json={"dataset_id": dataset_id, "k": 40, "holdout_fraction": 0, **fields}
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert product in problem["detail"]
    assert "MIXREG_FIT_MEMORY_BYTES = 4,294,967,296" in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", field]
    assert count_rows() == before  # no job queued


def test_the_bound_is_the_setting(migrated_database_url):
    settings = Settings(
        database_url=migrated_database_url, embedded_worker=False, fit_memory_bytes=1_000_000
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        dataset_id = _dataset(client, 400, 20)
        # 3 x 22 + 2 = 68 parameters: 370 KB.
        small = {"dataset_id": dataset_id, "k": 3, "standard_errors": True}
        assert client.post("/fit", json=small).status_code == 202
        # 8 x 22 + 7 = 183 parameters: 2.7 MB.
        large = {"dataset_id": dataset_id, "k": [2, 8], "standard_errors": True}
        refused = client.post("/fit", json=large)
        assert refused.status_code == 422
        assert "k=8 lines of 20 features" in refused.json()["detail"]
        assert "MIXREG_FIT_MEMORY_BYTES = 1,000,000" in refused.json()["detail"]
        # Without standard errors the same fit holds no such matrix.
        assert client.post("/fit", json={**large, "standard_errors": False}).status_code == 202
