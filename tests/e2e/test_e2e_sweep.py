"""k sweeps over real HTTP: a model per k and the k BIC prefers; a cancelled sweep stores none."""

from __future__ import annotations

from itertools import pairwise

import pytest

from mixreg.datasets import make_realizable

from .conftest import Server, ServerFactory, mixture_data

pytestmark = pytest.mark.e2e


def test_a_sweep_over_data_from_three_lines_prefers_three(server: Server):
    X, y, *_ = make_realizable(
        n_samples=600, n_features=2, n_components=3, noise=0.3, random_state=7
    )
    job_id = server.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": [1, 2, 3, 4], "seed": 3})
    job = server.wait_for_job(job_id)
    assert job["status"] == "succeeded", job
    assert job["k_values"] == [1, 2, 3, 4]
    sweep = job["sweep"]
    assert sweep["best_n_components"] == 3
    assert [entry["n_components"] for entry in sweep["models"]] == [1, 2, 3, 4]
    assert job["model_id"] == sweep["models"][2]["model_id"]
    models = [server.request("GET", entry["model_url"]).json() for entry in sweep["models"]]
    for entry, model in zip(sweep["models"], models, strict=True):
        assert (model["job_id"], model["n_components"]) == (job_id, entry["n_components"])
        assert (model["bic"], model["algorithm"]) == (entry["bic"], "auto")
    # Each k after the first also started from the (k - 1)-line model plus one line, so the
    # training min-loss never grows along the sweep.
    assert [model["candidates"][0]["source"] == "init" for model in models] == [
        False,
        True,
        True,
        True,
    ]
    losses = [model["train_min_loss"] for model in models]
    assert all(later <= earlier for earlier, later in pairwise(losses))
    assert server.request("GET", "/models").json()["total"] == 4


def test_a_sweep_cancelled_midway_stores_no_model(make_server: ServerFactory):
    # More partitions than the default MIXREG_MAX_N_PARTITIONS: each k runs to its budget.
    server = make_server(MIXREG_MAX_N_PARTITIONS=str(10**9))
    # Enough training rows for each of 20 lines to own p + 1 of them (a sweep's k is refused
    # otherwise).
    X, y = mixture_data(n_rows=150)
    # Every k searches for its whole one-second budget: the sweep takes about 20 s.
    job_id = server.fit(
        {
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": list(range(1, 21)),
            "algorithm": "subsample",
            "params": {"n_partitions": 10**9, "subsample_size": 30},
            "time_budget_s": 1,
        }
    )
    running = server.wait_for_job(
        job_id, lambda job: (job["progress"]["n_components"] or 0) >= 3, timeout=30
    )
    assert running["status"] == "running"
    assert 2 / 20 <= running["progress"]["fraction"] < 1

    assert server.request("POST", f"/jobs/{job_id}/cancel").status_code == 202
    job = server.wait_for_job(job_id, timeout=30)
    assert job["status"] == "cancelled"
    assert (job["model_id"], job["sweep"]) == (None, None)
    # The models of the k fitted before the cancellation were never stored.
    assert server.request("GET", "/models").json()["total"] == 0
