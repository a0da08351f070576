"""Fit, poll and predict over real HTTP; the numbers equal mixreg's and survive a restart."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions

from .conftest import Server, mixture_data

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The module's server on each backend: each test fits its own data and looks only at its
    own datasets, jobs and models."""
    return shared_server


SEED = 11
HOLDOUT = 0.25


def direct_fit(X: np.ndarray, y: np.ndarray, **params) -> MixtureOfLinearRegressions:
    """mixreg fitted in this process on the documented training split."""
    n_holdout = round(HOLDOUT * len(y))
    train = np.sort(np.random.default_rng(SEED).permutation(len(y))[n_holdout:])
    estimator = MixtureOfLinearRegressions(
        n_components=2, algorithm="auto", random_state=SEED, **params
    )
    return estimator.fit(X[train], y[train])


def submit(server: Server, X: np.ndarray, y: np.ndarray) -> dict:
    job_id = server.fit(
        {
            "data": {"X": X.tolist(), "y": y.tolist(), "feature_names": ["a", "b", "c"]},
            "k": 2,
            "params": {"n_partitions": 300, "subsample_size": 40},
            "seed": SEED,
            "holdout_fraction": HOLDOUT,
        }
    )
    job = server.wait_for_job(job_id)
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 1
    assert job["progress"]["fraction"] == 1.0
    return job


def test_fit_poll_predict_equals_mixreg_fitted_directly(server: Server):
    X, y = mixture_data()
    job = submit(server, X, y)
    expected = direct_fit(X, y, n_partitions=300, subsample_size=40)

    model = server.request("GET", job["model_url"]).json()
    assert model["n_train"] == 150 and model["n_holdout"] == 50
    assert model["feature_names"] == ["a", "b", "c"]
    stored_coef = np.array([component["coef"] for component in model["components"]])
    np.testing.assert_array_equal(stored_coef, expected.coef_)
    np.testing.assert_array_equal(
        [component["intercept"] for component in model["components"]], expected.intercept_
    )

    response = server.request(
        "POST", "/predict", json={"model_id": model["id"], "X": X.tolist(), "y": y.tolist()}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    np.testing.assert_array_equal(np.array(body["predictions"]), expected.predict(X))
    assert body["min_loss"] == expected.min_loss(X, y)
    np.testing.assert_array_equal(body["best_component"], expected.best_component(X, y))
    # The mixture beats the single least-squares line it is reported next to.
    assert model["holdout_min_loss"] < model["baseline"]["holdout_min_loss"]


def test_predictions_are_identical_after_a_restart(server: Server):
    X, y = mixture_data(seed=5)
    job = submit(server, X, y)
    model_id = job["model_id"]
    before = server.request("POST", f"/models/{model_id}/predict", json={"X": X.tolist()}).json()
    record_before = server.request("GET", f"/models/{model_id}").json()

    server.restart()

    after = server.request("POST", f"/models/{model_id}/predict", json={"X": X.tolist()}).json()
    assert np.array_equal(np.array(after["predictions"]), np.array(before["predictions"]))
    assert server.request("GET", f"/models/{model_id}").json() == record_before
