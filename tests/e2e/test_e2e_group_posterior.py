"""A grouped model's predict with known groups answers each group's posterior over the lines as
well as its line, over real HTTP (SQLite and PostgreSQL): EM's own posteriors of its training
groups, the one-hot of the line for other algorithms, null for a group the fit never saw."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg_client import Client

from .conftest import Server
from .test_e2e_weights_groups import segments, succeeded_model, upload

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The module's server on each backend: each test fits its own data and looks only at its
    own datasets, jobs and models."""
    return shared_server


INIT = np.array([[1.0, 0.0, 0.5], [-1.0, 0.5, -0.5]])


def close_segments(seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """40 groups of 2 to 6 rows on one of two close lines with noise 1: a group's few rows
    leave its line uncertain, so its posterior is far from one-hot."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(40), rng.integers(2, 7, size=40))
    X = rng.uniform(-1.0, 1.0, size=(groups.size, 2))
    line = groups % 2
    y = np.where(line == 0, X @ [1.5, 0.0] + 0.5, X @ [-1.5, 0.5] - 0.5)
    y += rng.standard_normal(groups.size)
    return X, y, np.array([f"user-{g}" for g in groups])


def test_an_em_fit_answers_its_training_groups_posteriors(server: Server):
    X, y, labels = close_segments()
    dataset_id = upload(server, X, y, {"user": labels.tolist()})
    model = succeeded_model(
        server,
        {
            "dataset_id": dataset_id,
            "k": 2,
            "algorithm": "em",
            "params": {"init": INIT.tolist()},
            "holdout_fraction": 0.0,
            "groups": "user",
        },
    )
    local = MixtureOfLinearRegressions(2, algorithm="em", init=INIT).fit(X, y, groups=labels)
    coef = np.array([component["coef"] for component in model["components"]])
    np.testing.assert_allclose(coef, local.coef_, rtol=0, atol=1e-9)
    expected = local.group_posterior_
    # The set is meant to leave groups uncertain: many posteriors far from 0 and 1.
    assert ((expected.max(axis=1) < 0.9).sum()) >= 5

    asked = [*local.group_labels_.tolist(), "nobody"]
    response = server.request(
        "POST",
        f"/models/{model['id']}/predict",
        json={"X": np.zeros((len(asked), 2)).tolist(), "groups": asked},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["group_line"] == [*local.group_line_.tolist(), -1]
    assert answer["group_posterior"][-1] is None
    posterior = np.array(answer["group_posterior"][:-1])
    # Stored as float32: each probability within float32's rounding of the estimator's.
    np.testing.assert_allclose(posterior, expected, rtol=2**-23, atol=1e-38)
    np.testing.assert_array_equal(np.argmax(posterior, axis=1), answer["group_line"][:-1])

    with Client(server.base_url) as client:
        mixed = [asked[3], "nobody", asked[0]]
        grouped = client.predict(model["id"], X[:3], groups=mixed)
        assert grouped.group_posterior.shape == (3, 2)
        np.testing.assert_array_equal(grouped.group_posterior[[0, 2]], posterior[[3, 0]])
        assert np.isnan(grouped.group_posterior[1]).all()
        assert grouped.group_line.tolist() == [answer["group_line"][3], -1, answer["group_line"][0]]


def test_a_classical_am_fit_answers_the_one_hot_of_the_line(server: Server):
    X, y, labels = segments(n_groups=18, seed=2)
    dataset_id = upload(server, X, y, {"user": labels.tolist()})
    model = succeeded_model(
        server,
        {
            "dataset_id": dataset_id,
            "k": 3,
            "algorithm": "am-classic",
            "holdout_fraction": 0.0,
            "groups": "user",
        },
    )
    asked = [labels[0], "nobody", labels[-1], labels[0]]
    response = server.request(
        "POST",
        f"/models/{model['id']}/predict",
        json={"X": X[:4].tolist(), "groups": asked},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    lines = answer["group_line"]
    assert lines[1] == -1 and min(lines[0], lines[2]) >= 0
    posterior = answer["group_posterior"]
    assert posterior[1] is None
    for row, line in ((0, lines[0]), (2, lines[2]), (3, lines[3])):
        assert posterior[row] == np.eye(3)[line].tolist()
