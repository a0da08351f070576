"""Weighted and grouped fits over real HTTP: a dataset keeps its weight and group columns, POST
/fit names them, the model records them (with its group -> line table), and predict answers a
known group's line. On SQLite and PostgreSQL (the job path differs: embedded queue or
Procrastinate)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions, mixture_score
from mixreg_client import Client, GroupPredictions
from service.jobs.fit_spec import holdout_split

from .conftest import Server, mixture_data

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The module's server on each backend: each test fits its own data and looks only at its
    own datasets, jobs and models."""
    return shared_server


SLOPES = np.array([[3.0, 0.0], [-3.0, 1.0], [0.0, -3.0]])
INTERCEPTS = np.array([0.0, 4.0, -4.0])


def segments(n_groups: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of groups of 5 to 50 rows, each group on one of three lines."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 51, size=n_groups)
    segment = rng.permutation(np.arange(n_groups) % 3)
    groups = np.repeat(np.arange(n_groups), sizes)
    X = rng.uniform(-1.0, 1.0, size=(groups.size, 2))
    line = segment[groups]
    y = np.einsum("ij,ij->i", X, SLOPES[line]) + INTERCEPTS[line]
    y += 0.3 * rng.standard_normal(groups.size)
    labels = np.array([f"user-{g}" for g in groups], dtype=object)
    return X, y, labels


def upload(server: Server, X: np.ndarray, y: np.ndarray, columns: dict[str, Any]) -> str:
    body = {"X": X.tolist(), "y": y.tolist(), "columns": columns}
    response = server.request("POST", "/datasets", json=body)
    assert response.status_code == 201, response.text
    dataset_id: str = response.json()["id"]
    return dataset_id


def succeeded_model(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "succeeded", job
    response = server.request("GET", f"/models/{job['model_id']}")
    assert response.status_code == 200, response.text
    model: dict[str, Any] = response.json()
    return model


def test_a_weighted_fit_is_the_estimators_weighted_fit(server: Server):
    X, y = mixture_data(150, seed=5)
    weights = np.random.default_rng(5).integers(0, 4, size=150).astype(float)
    dataset_id = upload(server, X, y, {"w": weights.tolist()})
    init = [[1.0, 2.0, -1.0, -1.0], [-2.0, 0.5, 1.5, 1.0]]
    model = succeeded_model(
        server,
        {
            "dataset_id": dataset_id,
            "k": 2,
            "algorithm": "am-classic",
            "params": {"init": init},
            "holdout_fraction": 0.0,
            "weights": "w",
        },
    )
    assert model["weights"] == "w" and model["groups"] is None
    local = MixtureOfLinearRegressions(2, algorithm="am-classic", init=np.array(init))
    local.fit(X, y, sample_weight=weights)
    coef = np.array([component["coef"] for component in model["components"]])
    np.testing.assert_allclose(coef, local.coef_, rtol=0, atol=1e-9)
    assert model["train_min_loss"] == pytest.approx(local.train_loss_, rel=1e-9)
    # Integer weights are repeated rows: the same lines as a fit of the repeated rows.
    repeats = weights.astype(int)
    repeated = MixtureOfLinearRegressions(2, algorithm="am-classic", init=np.array(init)).fit(
        np.repeat(X, repeats, axis=0), np.repeat(y, repeats)
    )
    np.testing.assert_allclose(coef, repeated.coef_, rtol=0, atol=1e-9)


def failed_job_error(server: Server, body: dict[str, Any]) -> str:
    """The error of the job ``body`` queues, which must fail: the values of a column are the
    fit process's to check (the request reads no row)."""
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "failed" and job["model_id"] is None, job
    error: str = job["error"]
    return error


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ([-1.0] + [1.0] * 59, "w", "weights: column 'w' is -1 in row 0; weights must be >= 0"),
        ([1.0] * 59 + [None], "w", "weights: column 'w' has no finite number in row 59"),
        ([0.0] * 60, "w", "weights: column 'w' is zero in every row"),
    ],
)
def test_bad_weights_fail_the_job_naming_weights(server: Server, values, field, message):
    X, y = mixture_data(60)
    dataset_id = upload(server, X, y, {"w": values})
    body = {"dataset_id": dataset_id, "k": 2, "weights": field}
    assert failed_job_error(server, body).startswith(message)


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        (["a"] * 60, "w", "weights names 'w' which holds text; a number column is needed"),
        ([1.0] * 60, "nope", "weights names the column 'nope' which the dataset does not have"),
    ],
)
def test_bad_weights_columns_are_422s_naming_weights(server: Server, values, field, message):
    X, y = mixture_data(60)
    dataset_id = upload(server, X, y, {"w": values})
    response = server.request(
        "POST", "/fit", json={"dataset_id": dataset_id, "k": 2, "weights": field}
    )
    assert response.status_code == 422, response.text
    assert message in response.text


def test_a_grouped_fit_keeps_groups_whole_and_predicts_their_lines(server: Server):
    X, y, labels = segments()
    dataset_id = upload(server, X, y, {"user": labels.tolist()})
    model = succeeded_model(
        server,
        {
            "dataset_id": dataset_id,
            "k": 3,
            "algorithm": "am-classic",
            "params": {"n_init": 10},
            "holdout_fraction": 0.25,
            "seed": 4,
            "groups": "user",
        },
    )
    metrics = model["group_metrics"]
    # The holdout keeps groups whole: every group is on exactly one side.
    assert metrics["n_groups_train"] + metrics["n_groups_holdout"] == 30
    train, holdout = holdout_split(len(y), 0.25, 4, labels)
    assert not set(labels[train]) & set(labels[holdout])
    assert metrics["n_groups_holdout"] == len(set(labels[holdout]))
    # Separated segments: each line is one of the true lines, and the unseen holdout
    # groups, each on its best line, fit as well as the training groups.
    np.testing.assert_allclose(
        np.sort([c["intercept"] for c in model["components"]]), np.sort(INTERCEPTS), atol=0.3
    )
    assert metrics["holdout_group_min_loss"] < 2 * metrics["train_group_min_loss"]

    # Predict: a training group gets the line that fits its rows best; an unseen one -1.
    seen, unseen = labels[train][0], labels[holdout][0]
    rows = labels == seen
    asked = [seen, unseen, "nobody"]
    response = server.request(
        "POST",
        f"/models/{model['id']}/predict",
        json={"X": X[:3].tolist(), "groups": asked},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    coef = np.array([component["coef"] for component in model["components"]])
    intercept = np.array([component["intercept"] for component in model["components"]])
    errors = ((X[rows] @ coef.T + intercept - y[rows, None]) ** 2).sum(axis=0)
    assert answer["group_line"] == [int(np.argmin(errors)), -1, -1]
    assert len(answer["predictions"]) == 3

    # .npy holds predictions only: the lines of groups need JSON.
    response = server.request(
        "POST",
        f"/models/{model['id']}/predict",
        json={"X": X[:3].tolist(), "groups": asked},
        headers={"Accept": "application/x-npy"},
    )
    assert response.status_code == 406, response.text
    assert "group_line" in response.text


def test_a_grouped_k_sweep_scores_every_k_as_the_grouped_mixture(server: Server):
    X, y, labels = segments(seed=1)
    dataset_id = upload(server, X, y, {"user": labels.tolist()})
    job = server.wait_for_job(
        server.fit(
            {
                "dataset_id": dataset_id,
                "k": [1, 2, 3, 4],
                "holdout_fraction": 0.25,
                "seed": 4,
                "groups": "user",
            }
        )
    )
    assert job["status"] == "succeeded", job
    sweep = job["sweep"]
    assert sweep["best_n_components"] == 3
    train, _ = holdout_split(len(y), 0.25, 4, labels)
    previous = None
    for entry in sweep["models"]:
        model = server.request("GET", entry["model_url"]).json()
        assert model["groups"] == "user"
        coef = [component["coef"] for component in model["components"]]
        intercept = [component["intercept"] for component in model["components"]]
        score = mixture_score(
            X[train],
            y[train],
            coef,
            intercept,
            fit_intercept=True,
            groups=labels[train],
            previous=previous,
            random_state=4,
        )
        previous = score
        assert entry["log_likelihood"] == pytest.approx(score.log_likelihood, rel=1e-7)
        assert entry["bic"] == pytest.approx(score.bic, rel=1e-7)


def test_bad_groups_are_422s_or_fail_the_job_naming_groups(server: Server):
    X, y = mixture_data(60)
    labels = [f"g{i % 6}" for i in range(60)]
    dataset_id = upload(
        server,
        X,
        y,
        {
            "user": labels,
            "row": [f"r{i}" for i in range(60)],
            "holey": [None, *labels[1:]],
        },
    )
    cases = [
        ({"groups": "user", "algorithm": "am"}, "groups: algorithm 'am' does not fit groups"),
        ({"groups": "nope"}, "groups names the column 'nope' which the dataset does not have"),
    ]
    for extra, message in cases:
        body = {"dataset_id": dataset_id, "k": 2, **extra}
        response = server.request("POST", "/fit", json=body)
        assert response.status_code == 422, response.text
        assert message in response.text
    failing = [
        ({"groups": "row"}, "groups: every row is its own group"),
        ({"groups": "holey"}, "groups: column 'holey' has no label in row 0"),
    ]
    for extra, message in failing:
        body = {"dataset_id": dataset_id, "k": 2, **extra}
        assert failed_job_error(server, body).startswith(message)
    inline = {"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "groups": "user"}
    response = server.request("POST", "/fit", json=inline)
    assert response.status_code == 422
    assert "inline data carry no extra columns" in response.text


def test_predicting_groups_with_an_ungrouped_model_is_a_422(server: Server):
    X, y = mixture_data(80)
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am"})
    )
    response = server.request(
        "POST", f"/models/{job['model_id']}/predict", json={"X": X[:2].tolist(), "groups": [1, 2]}
    )
    assert response.status_code == 422
    assert "was not fitted with groups" in response.text


def test_the_client_fits_with_weights_and_groups_and_predicts_groups(server: Server):
    X, y, labels = segments(n_groups=18, seed=2)
    weights = np.random.default_rng(2).uniform(0.5, 2.0, size=len(y))
    dataset_id = upload(server, X, y, {"user": labels.tolist(), "w": weights.tolist()})
    with Client(server.base_url) as client:
        fitted = client.fit(
            dataset_id,
            k=3,
            algorithm="am-classic",
            weights="w",
            groups="user",
            holdout_fraction=0.0,
        )
        job = fitted.wait(timeout=120)
        assert job.status == "succeeded", job
        model = fitted.model()
        answer = client.predict(model.id, X[:4], groups=labels[:4])
        assert isinstance(answer, GroupPredictions)
        assert answer.predictions.shape == (4, 3)
        assert set(answer.group_line.tolist()) <= {0, 1, 2}
        assert client.predict(model.id, X[:4]).shape == (4, 3)
