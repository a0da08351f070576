"""k sweeps (a model per k, the preferred k by BIC) and what a fit records about its quality:
auto's candidates, convergence, warnings, BIC and the comparison with the one-line baseline."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from itertools import pairwise

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions, mixture_score, predict_lines
from mixreg._loss import row_min_losses
from mixreg._selection import LIKELIHOOD_DROP_SLACK
from mixreg.datasets import make_realizable
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store.session import session_scope
from service.config import Settings
from service.jobs.fit_spec import holdout_split
from service.jobs.training import run_job

MAX_K_SWEEP = 6
SEED = 1


@pytest.fixture
def settings(migrated_database_url: str) -> Settings:
    """The app without its embedded worker, and a small cap on the k values of a sweep."""
    return Settings(
        database_url=migrated_database_url, embedded_worker=False, max_k_sweep=MAX_K_SWEEP
    )


@pytest.fixture(scope="module")
def three_lines() -> tuple[np.ndarray, np.ndarray]:
    """600 rows drawn from 3 lines in 2 features, with noise 0.3."""
    X, y, *_ = make_realizable(
        n_samples=600, n_features=2, n_components=3, noise=0.3, random_state=4
    )
    return X, y


def inline(X: np.ndarray, y: np.ndarray, **fields) -> dict:
    return {"data": {"X": X.tolist(), "y": y.tolist()}, "seed": SEED, **fields}


def submit_and_run(client, run_queued_jobs, body: dict) -> dict:
    response = client.post("/fit", json=body)
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    job: dict = client.get(response.json()["url"]).json()
    return job


TOO_MANY_LINES = (
    "k=5 is more than the 4 training rows: holdout_fraction=0.2 holds out 1 of the 5 rows; "
    "lower k to at most 4, lower holdout_fraction (0 trains on every row), or add rows"
)


def assert_problem(response, detail: str) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == detail


def test_a_k_sweep_stores_a_model_per_k_and_prefers_the_true_k(
    client, run_queued_jobs, count_rows, three_lines
):
    X, y = three_lines
    response = client.post("/fit", json=inline(X, y, k=[5, 1, 3, 2, 4]))
    assert response.status_code == 202, response.text
    queued = client.get(response.json()["url"]).json()
    assert (queued["k_values"], queued["n_components"]) == ([1, 2, 3, 4, 5], 5)
    assert queued["params"]["n_init"] is None  # size-aware: each model records its own
    assert queued["sweep"] is None and queued["model_id"] is None

    assert run_queued_jobs() == ["succeeded"]
    job = client.get(queued["url"]).json()
    assert job["progress"]["fraction"] == 1.0
    sweep = job["sweep"]
    assert sweep["best_n_components"] == 3
    assert [entry["n_components"] for entry in sweep["models"]] == [1, 2, 3, 4, 5]
    best = sweep["models"][2]
    assert job["model_id"] == best["model_id"]
    assert job["model_url"] == best["model_url"] == f"/models/{best['model_id']}"
    assert best["bic"] == min(entry["bic"] for entry in sweep["models"])
    assert count_rows()["models"] == 5

    train, _ = holdout_split(len(y), 0.2, SEED)
    for entry in sweep["models"]:
        model = client.get(entry["model_url"]).json()
        assert model["job_id"] == job["id"]
        assert model["n_components"] == entry["n_components"]
        for key in ("train_min_loss", "holdout_min_loss", "log_likelihood", "bic"):
            assert model[key] == entry[key], key
        assert model["n_parameters"] == entry["n_parameters"]
        assert model["beats_baseline"] == entry["beats_baseline"]
        assert model["candidates"], "auto records its candidates"
        resolved = MixtureOfLinearRegressions(entry["n_components"]).resolved_parameters(
            len(train), 2
        )
        assert model["params"]["n_init"] == resolved["n_init"]
    # BIC of the stored lines as a Gaussian mixture on the training rows, at the highest
    # maximum found from the lines, random partitions (the job's seed) and splits of k - 1's
    # maximum: each k's own, never carried forward, and not falling as k grows.
    previous = None
    for entry in sweep["models"]:
        model = client.get(entry["model_url"]).json()
        coef = [component["coef"] for component in model["components"]]
        intercept = [component["intercept"] for component in model["components"]]
        score = mixture_score(
            X[train],
            y[train],
            coef,
            intercept,
            fit_intercept=True,
            previous=previous,
            random_state=SEED,
        )
        previous = score
        assert entry["bic"] == pytest.approx(score.bic, rel=1e-7)
        assert entry["log_likelihood"] == pytest.approx(score.log_likelihood, rel=1e-7)
    likelihoods = [entry["log_likelihood"] for entry in sweep["models"]]
    assert all(b >= a - LIKELIHOOD_DROP_SLACK for a, b in itertools.pairwise(likelihoods))
    assert len(set(likelihoods)) == len(likelihoods)
    # One line ties with the least-squares baseline; three beat it, without warnings.
    assert [entry["beats_baseline"] for entry in sweep["models"]] == [False] + [True] * 4
    assert job["warnings"] == []


def test_each_k_of_a_sweep_is_the_fit_a_single_k_job_makes(client, run_queued_jobs, noisy_data):
    X, y = noisy_data
    sweep_job = submit_and_run(client, run_queued_jobs, inline(X, y, k=[1, 2], algorithm="em"))
    single_job = submit_and_run(client, run_queued_jobs, inline(X, y, k=2, algorithm="em"))
    from_sweep = client.get(sweep_job["sweep"]["models"][1]["model_url"]).json()
    single = client.get(single_job["model_url"]).json()
    assert from_sweep["components"] == single["components"]
    assert from_sweep["baseline"] == single["baseline"]
    assert (single_job["k_values"], single_job["sweep"]) == (None, None)


def previous_plus_one_line(
    X: np.ndarray, y: np.ndarray, coef: np.ndarray, intercept: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The lines of a fit plus the least-squares line of the 1 / (k + 1) share of the rows they
    fit worst, written out here beside ``mixreg.service_support.sweep_warm_start``."""
    residuals = row_min_losses(y, predict_lines(X, coef, intercept))
    worst = np.argsort(residuals, kind="stable")[-(len(y) // (len(intercept) + 1)) :]
    line, *_ = np.linalg.lstsq(np.column_stack([X[worst], np.ones(len(worst))]), y[worst])
    return np.vstack([coef, line[:-1]]), np.append(intercept, line[-1])


def test_each_k_of_an_auto_sweep_also_starts_from_the_previous_k_plus_one_line(
    client, run_queued_jobs, three_lines
):
    X, y = three_lines
    job = submit_and_run(client, run_queued_jobs, inline(X, y, k=[1, 2, 3, 4]))
    models = [client.get(entry["model_url"]).json() for entry in job["sweep"]["models"]]
    train, _ = holdout_split(len(y), 0.2, SEED)
    X_train, y_train = X[train], y[train]
    assert "init" not in {candidate["source"] for candidate in models[0]["candidates"]}
    for previous, model in pairwise(models):
        coef = np.array([component["coef"] for component in previous["components"]])
        intercept = np.array([component["intercept"] for component in previous["components"]])
        start = previous_plus_one_line(X_train, y_train, coef, intercept)
        start_loss = float(row_min_losses(y_train, predict_lines(X_train, *start)).mean())
        # The start is polished first (and again if it is a finalist).
        given = [c for c in model["candidates"] if c["source"] == "init"]
        assert given and given[0] is model["candidates"][0]
        assert given[0]["min_loss_before"] == pytest.approx(start_loss, rel=1e-7)
        # One line more never fits worse, and the search keeps no worse than its start: the
        # training min-loss cannot grow with k along the sweep.
        assert start_loss <= previous["train_min_loss"] * (1 + 1e-9)
        assert model["train_min_loss"] <= given[0]["min_loss_after"] * (1 + 1e-9)
        assert model["train_min_loss"] <= previous["train_min_loss"] * (1 + 1e-9)
        # The stored parameters are those the job asked for; the start is the sweep's own.
        assert model["params"]["init"] is None


SMALL_X = [[0.0, 1.0], [1.0, 0.5], [2.0, -1.0], [3.0, 2.0], [4.0, 0.0]]
SMALL_Y = [1.0, 2.0, 0.5, 3.0, -1.0]


@pytest.mark.parametrize(
    ("k", "extra", "detail"),
    [
        pytest.param([], {}, "n_components is an empty list; give at least one number of lines"),
        pytest.param([1, 2, 2], {}, "n_components lists k=2 twice; give each k once", id="dup"),
        pytest.param([0, 1], {}, "n_components[0] must be an integer >= 1; got 0", id="zero"),
        pytest.param([1, 2.5], {}, "n_components[1] must be an integer >= 1; got 2.5", id="float"),
        pytest.param(
            [1, 2, 3, 4, 5, 6, 7],
            {"data": {"X": SMALL_X * 4, "y": SMALL_Y * 4}},
            f"k lists 7 values; a sweep fits at most {MAX_K_SWEEP} (MIXREG_MAX_K_SWEEP); "
            f"split it into several jobs",
            id="too-many",
        ),
        pytest.param([1, 2, 5], {}, TOO_MANY_LINES, id="above-the-rows"),
        pytest.param(
            [1, 2],
            {"algorithm": "am", "params": {"init": [[1.0, 2.0, 3.0], [0.0, 1.0, 2.0]]}},
            "params.init gives the starting lines of one k; it cannot be used with a list of k",
            id="init",
        ),
    ],
)
def test_bad_sweeps_are_422_and_write_nothing(client, count_rows, k, extra, detail):
    body = {"data": {"X": SMALL_X, "y": SMALL_Y}, "k": k, **extra}
    assert_problem(client.post("/fit", json=body), detail)
    assert count_rows() == {"datasets": 0, "jobs": 0, "models": 0}


def test_a_sweep_of_a_stored_dataset_checks_k_against_its_rows(client, count_rows):
    dataset = client.post("/datasets", json={"X": SMALL_X, "y": SMALL_Y}).json()
    before = count_rows()
    response = client.post("/fit", json={"dataset_id": dataset["id"], "n_components": [4, 5]})
    assert_problem(response, TOO_MANY_LINES)
    assert count_rows() == before


def test_a_fit_without_an_algorithm_runs_auto_and_records_its_candidates(
    client, run_queued_jobs, noisy_data
):
    X, y = noisy_data
    job = submit_and_run(client, run_queued_jobs, inline(X, y, k=2))
    assert job["algorithm"] == "auto"
    model = client.get(job["model_url"]).json()
    assert model["algorithm"] == "auto"
    assert model["params"]["n_init"] == job["params"]["n_init"] >= 1
    candidates = model["candidates"]
    assert len(candidates) >= model["params"]["n_init"]
    assert {"source", "min_loss_before", "min_loss_after", "seconds", "n_iter", "converged"} <= (
        set(candidates[0])
    )
    # The kept lines are the best polished candidate (losses on the training rows).
    best_after = min(c["min_loss_after"] for c in candidates if c["min_loss_after"] is not None)
    assert model["train_min_loss"] == pytest.approx(best_after, rel=1e-9)
    assert model["converged"] is True and model["beats_baseline"] is True
    assert model["warnings"] == job["warnings"] == []


def test_other_algorithms_record_no_candidates(client, run_queued_jobs, noisy_data):
    X, y = noisy_data
    job = submit_and_run(client, run_queued_jobs, inline(X, y, k=2, algorithm="em"))
    model = client.get(job["model_url"]).json()
    assert model["candidates"] is None
    assert isinstance(model["converged"], bool)


def test_a_fit_stopped_by_max_iter_records_the_convergence_warning(
    client, run_queued_jobs, noisy_data
):
    X, y = noisy_data
    job = submit_and_run(
        client, run_queued_jobs, inline(X, y, k=2, algorithm="am", params={"max_iter": 2})
    )
    assert job["status"] == "succeeded"
    model = client.get(job["model_url"]).json()
    assert model["converged"] is False
    [warning] = model["warnings"]
    assert warning.startswith("gradient AM stopped at max_iter=2 before converging")
    assert "raise max_iter (now 2)" in warning
    assert job["warnings"] == model["warnings"]
    listed = client.get("/models").json()["items"][0]
    assert (listed["warnings"], listed["converged"]) == (model["warnings"], False)


def test_the_warnings_of_a_sweep_name_their_k(client, run_queued_jobs, noisy_data):
    X, y = noisy_data
    job = submit_and_run(
        client, run_queued_jobs, inline(X, y, k=[2, 3], algorithm="am", params={"max_iter": 2})
    )
    expected = []
    for entry in job["sweep"]["models"]:
        model = client.get(entry["model_url"]).json()
        expected += [f"k={entry['n_components']}: {warning}" for warning in model["warnings"]]
    assert job["warnings"] == expected
    assert any(warning.startswith("k=3: gradient AM stopped") for warning in job["warnings"])


# Two lines far above the data, moved by one tiny gradient step: a fit worse than one line.
FAR_FROM_THE_DATA = {
    "init": [[0.0, 0.0, 1000.0], [0.0, 0.0, 2000.0]],
    "step_size": 1e-9,
    "max_iter": 1,
    "tol": 0.0,
}


@pytest.mark.parametrize(("holdout_fraction", "rows"), [(0.2, "holdout"), (0.0, "training")])
def test_a_fit_worse_than_the_baseline_says_so(
    client, run_queued_jobs, noisy_data, holdout_fraction, rows
):
    X, y = noisy_data
    body = inline(
        X,
        y,
        k=2,
        algorithm="am",
        params=FAR_FROM_THE_DATA,
        holdout_fraction=holdout_fraction,
    )
    job = submit_and_run(client, run_queued_jobs, body)
    assert job["status"] == "succeeded"
    model = client.get(job["model_url"]).json()
    loss = model[f"{rows}_min_loss" if rows == "holdout" else "train_min_loss"]
    reference = model["baseline"][f"{rows}_min_loss" if rows == "holdout" else "train_min_loss"]
    assert loss > 1000 * reference
    assert model["beats_baseline"] is False
    # tol=0 asks for exactly max_iter iterations: no convergence warning; the lines far from
    # the data leave one of them with no rows, which says so too. The standard errors belong
    # to the best maximum of the likelihood found (EM from random partitions of the rows too),
    # not to EM from those lines: they exist.
    degenerate, warning = model["warnings"]
    assert degenerate.startswith("1 of the 2 lines own fewer than the 4 training rows")
    assert model["components"][0]["estimates"]["coef"][0]["std_error"] > 0
    assert warning.startswith(
        f"{rows} min-loss {loss:.6g} is above the one-line least-squares baseline's "
        f"{reference:.6g}: the 2 lines "
    )
    assert "try algorithm 'auto'" in warning
    assert job["warnings"] == [degenerate, warning]
    listed = client.get("/models").json()["items"][0]
    assert listed["beats_baseline"] is False


def test_models_stored_before_the_diagnostics_read_as_unknown(client, app_sessionmaker, data):
    X, y = data
    with session_scope(app_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name=None, name=None
        )
        model_id = model_store.create_model(
            session,
            model_store.ModelRecord(
                job_id=None,
                dataset_id=dataset.id,
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
                train_min_loss=1.0,
                holdout_min_loss=0.5,
                baseline={
                    "coef": [1.0, 2.0],
                    "intercept": 0.0,
                    "train_min_loss": 2.0,
                    "holdout_min_loss": 0.75,
                },
                n_train=16,
                n_holdout=4,
                loss_history=[1.0],
                n_iter=1,
                fit_seconds=0.1,
            ),
        ).id
    model = client.get(f"/models/{model_id}").json()
    assert (model["converged"], model["log_likelihood"], model["bic"]) == (None, None, None)
    assert (model["n_parameters"], model["candidates"], model["warnings"]) == (None, None, [])
    assert model["beats_baseline"] is True  # 0.5 < 0.75 on the holdout


@pytest.mark.parametrize(
    ("k", "algorithm"), [([1, 2, 3, 4], "auto"), (3, "subsample+am")], ids=["sweep", "subsample"]
)
def test_the_jobs_best_min_loss_is_the_chosen_models(
    client, app_sessionmaker, settings, three_lines, k, algorithm
):
    X, y = three_lines
    response = client.post("/fit", json=inline(X, y, k=k, algorithm=algorithm))
    assert response.status_code == 202, response.text
    with session_scope(app_sessionmaker) as session:
        claimed = job_store.claim_next_job(session, worker_id="test", now=datetime.now(UTC))
        assert claimed is not None
        job_id = claimed.id
    # Every progress report written: the last one is the search's, not the chosen model's.
    assert (
        run_job(job_id, settings.database_url, worker_id="test", progress_interval_s=0.0)
        == "succeeded"
    )
    job = client.get(response.json()["url"]).json()
    model = client.get(job["model_url"]).json()
    assert job["progress"]["best_min_loss"] == model["train_min_loss"]


def test_an_exhaustive_search_with_one_line_succeeds(client, run_queued_jobs, noisy_data):
    # With one line every sub-sample has one partition; counting the sizes under the cap once
    # looped for ever and pinned the server's thread at submission.
    X, y = noisy_data
    job = submit_and_run(
        client, run_queued_jobs, inline(X, y, k=1, algorithm="subsample-exhaustive")
    )
    model = client.get(job["model_url"]).json()
    assert model["params"]["subsample_size"] == 150
    assert model["n_iter"] == 1
