"""Standard errors and the bootstrap over real HTTP: the numbers equal mixreg's, per line."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg_client import Client
from service.jobs.fit_spec import holdout_split

from .conftest import Server, ServerFactory, mixture_data

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The module's server on each backend: each test fits its own data and looks only at its
    own datasets, jobs and models."""
    return shared_server


SEED = 5
HOLDOUT = 0.2
FAST = {"algorithm": "am-classic", "params": {"n_init": 5}}


def _body(X: np.ndarray, y: np.ndarray, **fields) -> dict:
    return {
        "data": {"X": X.tolist(), "y": y.tolist(), "feature_names": ["a", "b", "c"]},
        "k": 2,
        "seed": SEED,
        "holdout_fraction": HOLDOUT,
        **FAST,
        **fields,
    }


def _succeeded_model(server: Server, body: dict) -> dict:
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "succeeded", job
    assert job["progress"]["fraction"] == 1.0
    response = server.request("GET", job["model_url"])
    assert response.status_code == 200, response.text
    model: dict = response.json()
    return model


def test_model_shows_per_line_the_standard_errors_and_bootstrap_of_mixreg(server: Server):
    X, y = mixture_data(n_rows=250, seed=8)
    model = _succeeded_model(server, _body(X, y, n_bootstrap=30, bootstrap="empirical"))

    train, _ = holdout_split(len(y), HOLDOUT, SEED)
    expected = MixtureOfLinearRegressions(
        2, algorithm="am-classic", n_init=5, random_state=SEED, standard_errors=True
    ).fit(X[train], y[train])
    boot = expected.bootstrap(X[train], y[train], 30, kind="empirical", random_state=SEED)

    assert model["uncertainty"]["method"] == "observed-information"
    assert model["uncertainty"]["level"] == 0.95
    assert model["uncertainty"]["bootstrap"] == {
        "kind": "empirical",
        "n_bootstrap": 30,
        "n_converged": boot.n_converged,
    }
    assert model["uncertainty"]["log_likelihood"] == pytest.approx(expected.log_likelihood_)
    for line, component in enumerate(model["components"]):
        estimates = component["estimates"]
        coef = estimates["coef"]
        assert [item["estimate"] for item in coef] == pytest.approx(expected.ml_coef_[line])
        assert [item["std_error"] for item in coef] == pytest.approx(expected.coef_se_[line])
        assert [item["bootstrap_std_error"] for item in coef] == pytest.approx(boot.coef_se[line])
        assert [item["bootstrap_lower"] for item in coef] == pytest.approx(
            boot.coef_interval[line, :, 0]
        )
        first = coef[0]
        assert first["z_value"] == pytest.approx(first["estimate"] / first["std_error"])
        assert first["lower"] < first["estimate"] < first["upper"]
        assert 0.0 <= first["p_value"] <= 1.0
        assert estimates["intercept"]["std_error"] == pytest.approx(expected.intercept_se_[line])
        assert estimates["weight"]["estimate"] == pytest.approx(expected.weights_[line])
        assert estimates["weight"]["z_value"] is None
        assert estimates["noise_variance"]["std_error"] == pytest.approx(
            expected.noise_variance_se_[line]
        )


def test_without_standard_errors_the_lines_carry_none(server: Server):
    X, y = mixture_data(n_rows=120)
    model = _succeeded_model(server, _body(X, y, standard_errors=False))
    assert model["uncertainty"] is None
    assert all(component["estimates"] is None for component in model["components"])


def test_a_sweep_gives_every_k_its_standard_errors(server: Server):
    X, y = mixture_data(n_rows=200)
    job = server.wait_for_job(server.fit(_body(X, y, k=[1, 2])))
    assert job["status"] == "succeeded", job
    for entry in job["sweep"]["models"]:
        model = server.request("GET", f"/models/{entry['model_id']}").json()
        assert len(model["components"]) == entry["n_components"]
        for component in model["components"]:
            assert all(item["std_error"] > 0 for item in component["estimates"]["coef"])


def test_bad_bootstrap_requests_are_422_naming_the_field(make_sqlite_server: ServerFactory):
    # Refused before anything is stored: one backend shows it.
    server = make_sqlite_server(MIXREG_MAX_N_BOOTSTRAP="50")
    X, y = mixture_data(n_rows=60)
    too_many = server.request("POST", "/fit", json=_body(X, y, n_bootstrap=51))
    assert too_many.status_code == 422
    assert (
        "n_bootstrap = 51 is above the limit of 50 (MIXREG_MAX_N_BOOTSTRAP)"
        in (too_many.json()["detail"])
    )
    for field, value in (("bootstrap", "jackknife"), ("n_bootstrap", -1), ("n_bootstrap", 2.5)):
        response = server.request("POST", "/fit", json=_body(X, y, **{field: value}))
        assert response.status_code == 422, response.text
        assert field in response.text


def test_cancel_stops_a_running_bootstrap(make_server: ServerFactory):
    server = make_server(MIXREG_PROGRESS_INTERVAL_S="0")
    X, y = mixture_data(n_rows=3000)
    job_id = server.fit(_body(X, y, n_bootstrap=1000))
    # The fit is the first half of the progress, the bootstrap the second.
    server.wait_for_job(job_id, lambda job: job["progress"]["fraction"] > 0.5, timeout=120)
    assert server.request("POST", f"/jobs/{job_id}/cancel").status_code == 202
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "cancelled"
    assert job["model_id"] is None


def test_the_client_prints_the_summary_of_a_model(server: Server):
    X, y = mixture_data(n_rows=200, seed=4)
    with Client(server.base_url) as client:
        dataset = client.upload(X, y, feature_names=["a", "b", "c"])
        job = client.fit(dataset, k=2, seed=SEED, n_bootstrap=10, **FAST).wait()
        model = client.get_model(job.model_id or "")
        table = model.summary()
        no_errors = client.get_model(
            client.fit(dataset, k=2, standard_errors=False, **FAST).wait().model_id or ""
        )
    stored = server.request("GET", f"/models/{model.id}").json()["components"]
    assert [row["parameter"] for row in table.rows[:6]] == [
        "a",
        "b",
        "c",
        "(Intercept)",
        "weight",
        "noise_variance",
    ]
    assert table.rows[7]["std_error"] == stored[1]["estimates"]["coef"][1]["std_error"]
    assert table.rows[7]["bootstrap_std_error"] > 0
    text = str(table)
    assert "$Comp.0" in text and "$Comp.1" in text and "Pr(>|z|)" in text
    assert f"{table.rows[0]['std_error']:12.5g}" in text
    with pytest.raises(ValueError, match="has no standard errors"):
        no_errors.summary()
