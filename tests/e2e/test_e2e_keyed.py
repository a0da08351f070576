"""Keyed fits over real HTTP: a dataset uploaded with its account column, one job fitting a
mixture per account, keyed predictions (unknown keys by the global model or a 422), one key's
lines, and every bad input a 4xx naming the field."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from mixreg import fit_per_key
from mixreg.datasets import make_shared_accounts
from mixreg_client import Client

from .conftest import Server, ServerFactory, module_sqlite_server

pytestmark = pytest.mark.e2e

N_ACCOUNTS, N_RATINGS = 12, 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "keyed")


def accounts() -> tuple[np.ndarray, np.ndarray, list]:
    X, y, account, _ = make_shared_accounts(
        n_accounts=N_ACCOUNTS, n_ratings=N_RATINGS, n_features=2, random_state=7
    )
    names = [f"acct-{a}" for a in account.tolist()]
    # A small account (k = 1), a row without an account (empty text), a one-row account.
    names[:3] = ["tiny", "tiny", "tiny"]
    names[3] = ""
    names[4] = "single"
    return X, y, names


def upload(server: Server, X, y, columns: dict) -> str:
    response = server.request(
        "POST",
        "/datasets",
        json={"X": X.tolist(), "y": y.tolist(), "feature_names": ["a", "b"], "columns": columns},
    )
    assert response.status_code == 201, response.text
    dataset_id: str = response.json()["id"]
    return dataset_id


def fit_accounts(server: Server) -> tuple[str, np.ndarray, list]:
    """A keyed model of ``accounts()`` fitted on ``server``: its id, the rows and their keys."""
    X, y, names = accounts()
    dataset_id = upload(server, X, y, {"account": names})
    job_id = server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account", "seed": 1})
    job = server.wait_for_job(job_id, timeout=300)
    assert job["status"] == "succeeded", job
    return job["model_id"], X, names


def problem(response) -> str:
    assert response.status_code == 422, response.text
    detail: str = response.json()["detail"]
    return detail


def test_a_keyed_fit_fits_every_account_and_predicts_by_key(server: Server):
    X, y, names = accounts()
    dataset_id = upload(server, X, y, {"account": names})
    job_id = server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account", "seed": 3})
    job = server.wait_for_job(job_id, timeout=120)
    assert job["status"] == "succeeded", job
    assert job["split_by"] == "account"
    summary = job["keyed"]
    assert summary["n_keys"] == N_ACCOUNTS + 2
    assert summary["rows_without_key"] == 1
    assert summary["keys_by_status"] == {
        "fitted": N_ACCOUNTS,
        "k1": 2,
        "skipped": 0,
        "failed": 0,
    }
    assert job["progress"]["keys_done"] == job["progress"]["n_keys"] == N_ACCOUNTS + 2
    assert set(summary["min_loss_quantiles"]) == {"q00", "q50", "q90", "q99", "q100"}
    model_id = job["model_id"]
    model = server.request("GET", f"/models/{model_id}").json()
    assert model["split_by"] == "account" and model["keyed"] == summary

    # The service's lines are those of fit_per_key on the same rows and keys.
    keys = np.array([None if name == "" else name for name in names], dtype=object)
    reference = fit_per_key(X, y, keys, 2, random_state=3, global_model=False)
    rows = [5, 6, 7, 8]
    asked = [names[i] for i in rows]
    response = server.request(
        "POST", f"/models/{model_id}/predict", json={"X": X[rows].tolist(), "keys": asked}
    )
    assert response.status_code == 200, response.text
    served = np.array(response.json()["predictions"])
    own = np.array(
        [
            server.request("GET", f"/models/{model_id}/keys/{key}").json()["min_loss"]
            for key in asked
        ]
    )
    positions = np.searchsorted(reference.keys.astype(str), asked)
    np.testing.assert_allclose(own, reference.min_loss[positions], rtol=1e-6)
    for row, key, predicted in zip(rows, asked, served, strict=True):
        lines = server.request("GET", f"/models/{model_id}/keys/{key}").json()
        assert lines["status"] == "fitted" and lines["n_rows"] == names.count(key)
        expected = [
            np.dot(X[row], component["coef"]) + component["intercept"]
            for component in lines["components"]
        ]
        np.testing.assert_allclose(predicted, expected, rtol=1e-12)

    tiny = server.request("GET", f"/models/{model_id}/keys/tiny").json()
    assert tiny["status"] == "k1" and tiny["n_rows"] == 3
    assert [c["share"] for c in tiny["components"]] == [1.0, 0.0]

    # Unknown keys: the global model (the model's own lines), or a 422 naming them.
    global_lines = model["components"]
    response = server.request(
        "POST", f"/models/{model_id}/predict", json={"X": [X[0].tolist()], "keys": ["nobody"]}
    )
    expected = [np.dot(X[0], c["coef"]) + c["intercept"] for c in global_lines]
    np.testing.assert_allclose(response.json()["predictions"][0], expected, rtol=1e-12)
    detail = problem(
        server.request(
            "POST",
            "/predict",
            json={
                "model_id": model_id,
                "X": [X[0].tolist(), X[1].tolist()],
                "keys": ["nobody", "acct-1"],
                "unknown_keys": "error",
            },
        )
    )
    assert "keys" in detail and "'nobody'" in detail and "acct-1" not in detail
    assert server.request("GET", f"/models/{model_id}/keys/nobody").status_code == 404

    # Bad predict bodies: no keys for a keyed model, keys of the wrong length or type.
    assert "keys" in problem(
        server.request("POST", f"/models/{model_id}/predict", json={"X": [X[0].tolist()]})
    )
    assert "keys has 2 values but X has 1 rows" in problem(
        server.request(
            "POST", f"/models/{model_id}/predict", json={"X": [X[0].tolist()], "keys": ["a", "b"]}
        )
    )
    assert "keys" in problem(
        server.request(
            "POST", f"/models/{model_id}/predict", json={"X": [X[0].tolist()], "keys": [1.5]}
        )
    )
    assert "unknown_keys" in problem(
        server.request(
            "POST",
            f"/models/{model_id}/predict",
            json={"X": [X[0].tolist()], "keys": ["a"], "unknown_keys": "maybe"},
        )
    )


def test_integer_keys_and_the_client(server: Server):
    X, y, account, _ = make_shared_accounts(
        n_accounts=6, n_ratings=50, n_features=2, random_state=9
    )
    dataset_id = upload(server, X, y, {"account": (account * 10).astype(float).tolist()})
    client = Client(server.base_url)
    try:
        job = client.fit(dataset_id, k=2, split_by="account").wait(timeout=120)
        assert job.status == "succeeded"
        assert job.raw["keyed"]["keys_by_status"]["fitted"] == 6
        model_id = job.model_id
        predicted = client.predict(model_id, X[:3], keys=(account[:3] * 10).tolist())
        for row in range(3):
            lines = server.request(
                "GET", f"/models/{model_id}/keys/{int(account[row] * 10)}"
            ).json()
            expected = [np.dot(X[row], c["coef"]) + c["intercept"] for c in lines["components"]]
            np.testing.assert_allclose(predicted[row], expected, rtol=1e-12)
    finally:
        client.close()
    assert server.request("GET", f"/models/{model_id}/keys/abc").status_code == 404
    plain = server.fit({"dataset_id": dataset_id, "k": 2})
    plain_model = server.wait_for_job(plain, timeout=120)["model_id"]
    assert "not keyed" in problem(
        server.request(
            "POST", f"/models/{plain_model}/predict", json={"X": [X[0].tolist()], "keys": [0]}
        )
    )


def test_bad_keyed_fits_are_422s_naming_split_by(server: Server):
    X, y, account, _ = make_shared_accounts(n_accounts=3, n_ratings=20, n_features=2)
    dataset_id = upload(
        server,
        X,
        y,
        {"account": account.tolist(), "score": (account + 0.5).tolist()},
    )
    cases = {
        "a missing column": ({"split_by": "user"}, "split_by names the column 'user'"),
        "inline data": (
            {"split_by": "account", "dataset_id": None, "data": {"X": X.tolist(), "y": y.tolist()}},
            "split_by names a column of a stored dataset",
        ),
        "a k sweep": ({"split_by": "account", "k": [1, 2]}, "split_by fits one k per key"),
        "a bad small_keys": ({"split_by": "account", "small_keys": "drop"}, "small_keys"),
    }
    for label, (change, message) in cases.items():
        body = {"dataset_id": dataset_id, "k": 2, **change}
        body = {name: value for name, value in body.items() if value is not None}
        detail = problem(server.request("POST", "/fit", json=body))
        assert message in detail, (label, detail)
    # Keys that are not integers are the fit process's to find (the request reads no row).
    job = server.wait_for_job(server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "score"}))
    assert job["status"] == "failed", job
    assert "split_by names 'score' whose numbers are not all integers" in job["error"]


def test_cancel_stops_a_keyed_fit(server: Server, tmp_path: Path):
    X, y, account, _ = make_shared_accounts(
        n_accounts=3000, n_ratings=40, n_features=2, random_state=1
    )
    dataset_id = upload(server, X, y, {"account": account.tolist()})
    job_id = server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account"})
    server.wait_for_job(job_id, until=lambda job: (job["progress"]["keys_done"] or 0) > 0)
    assert server.request("POST", f"/jobs/{job_id}/cancel").status_code in (200, 202)
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "cancelled"
    assert job["model_id"] is None
    assert job["progress"]["keys_done"] < 3000


def test_the_readme_keyed_example_runs_as_written(server: Server, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## A model per account: keyed fits", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("MIXREG_URL", server.base_url)
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("{'fitted': 50, 'k1': 0, 'skipped': 0, 'failed': 0")
    assert "[[" in printed[1]


def test_missing_keys_are_counted_and_one_row_keys_take_one_line(server: Server):
    rng = np.random.default_rng(2)
    n_rows = 100_000
    X = rng.standard_normal((n_rows, 2))
    y = X @ [1.0, -1.0] + rng.standard_normal(n_rows)
    keys: list = list(range(n_rows))
    keys[:4] = [None] * 4
    dataset_id = upload(server, X, y, {"id": keys})
    job_id = server.fit(
        {"dataset_id": dataset_id, "k": 2, "split_by": "id", "params": {"n_init": 4}}
    )
    job = server.wait_for_job(job_id, timeout=300)
    assert job["status"] == "succeeded", job
    assert job["keyed"]["rows_without_key"] == 4
    assert job["keyed"]["keys_by_status"]["k1"] == n_rows - 4
    model_id = job["model_id"]
    one = server.request("GET", f"/models/{model_id}/keys/99999").json()
    assert one["status"] == "k1" and one["n_rows"] == 1
    predicted = server.request(
        "POST", f"/models/{model_id}/predict", json={"X": [X[-1].tolist()], "keys": [99999]}
    ).json()["predictions"][0]
    # One row: the key's line passes through it.
    np.testing.assert_allclose(predicted, [y[-1], y[-1]], rtol=1e-8)


def keyed_shards(database_url: str, model_id: str) -> list[tuple[int, int, int]]:
    """(position, keys, attempt that fitted them) of every stored chunk of a keyed model."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT position, n_keys, fitted_attempt FROM keyed_model_chunks "
                    "WHERE model_id = :model ORDER BY position"
                ),
                {"model": model_id},
            ).all()
        return [(int(a), int(b), int(c)) for a, b, c in rows]
    finally:
        engine.dispose()


SHARD, RATINGS = 50, 24
"""Keys per shard, and rows per key, of the fits killed midway."""
KILLED_ACCOUNTS = 80 * SHARD
"""Accounts of a fit killed midway: enough shards that the kill, once two are stored, lands
well before the last (a fit of a few shards ends before its progress is even seen)."""


def killed_mid_keyed_fit(api: Server, kill: Callable[[dict], None], n_accounts: int) -> dict:
    """Fit ``n_accounts`` accounts in shards of :data:`SHARD` keys, ``kill`` whatever runs the
    job once two shards are stored, and return the finished job."""
    X, y, account, _ = make_shared_accounts(
        n_accounts=n_accounts, n_ratings=RATINGS, n_features=2, random_state=3
    )
    dataset_id = upload(api, X, y, {"account": account.tolist()})
    job_id = api.fit(
        {
            "dataset_id": dataset_id,
            "k": 2,
            "split_by": "account",
            "keys_per_shard": SHARD,
            # The global model is not what is tested: a short search.
            "params": {"n_init": 4},
            "time_budget_s": 1.0,
        }
    )
    running = api.wait_for_job(
        job_id, until=lambda job: (job["progress"]["keys_done"] or 0) >= 2 * SHARD, timeout=200
    )
    assert running["status"] == "running", running
    kill(running)
    return api.wait_for_job(job_id, timeout=200)


def check_every_key_fitted_once(
    api: Server, job: dict, database_url: str, n_accounts: int, *, retry_fits_the_last=True
):
    assert job["status"] == "succeeded", job
    # Where other workers' shard tasks fit the rest, the lost worker's fit process may finish
    # the job itself before the retry: either way no key is lost or fitted twice.
    assert job["attempts"] == 2 if retry_fits_the_last else job["attempts"] in (1, 2)
    assert job["keyed"]["keys_by_status"]["fitted"] == n_accounts
    shards = keyed_shards(database_url, job["model_id"])
    assert [position for position, _, _ in shards] == list(range(n_accounts // SHARD))
    assert sum(keys for _, keys, _ in shards) == n_accounts
    # The shards stored before the kill were kept, not fitted again.
    attempts = [attempt for _, _, attempt in shards]
    assert attempts[:2] == [1, 1] and set(attempts) <= {1, 2}
    # Other workers' shard tasks may fit the rest while the job's worker is being found lost.
    if retry_fits_the_last:
        assert attempts[-1] == 2
    lines = api.request("GET", f"/models/{job['model_id']}/keys/{n_accounts - 1}").json()
    assert lines["status"] == "fitted" and lines["n_rows"] == RATINGS


def test_a_server_killed_mid_keyed_fit_fits_only_the_unstored_shards(
    make_sqlite_server: ServerFactory, sqlite_url: str
):
    server = make_sqlite_server()

    def kill_and_restart(job: dict) -> None:
        server.kill()
        server.start()

    job = killed_mid_keyed_fit(server, kill_and_restart, KILLED_ACCOUNTS)
    check_every_key_fitted_once(server, job, sqlite_url, KILLED_ACCOUNTS)


def test_open_inference_protocol_keyed_infer(server: Server):
    X, y, account, _ = make_shared_accounts(n_accounts=4, n_ratings=50, n_features=2)
    dataset_id = upload(server, X, y, {"account": [f"a{a}" for a in account.tolist()]})
    job = server.wait_for_job(
        server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account"}), timeout=120
    )
    model_id = job["model_id"]

    def infer(keys: dict, parameters: dict | None = None):
        body = {
            "inputs": [
                {"name": "X", "datatype": "FP64", "shape": [2, 2], "data": X[:2].ravel().tolist()},
                keys,
            ],
            **({"parameters": parameters} if parameters else {}),
        }
        return server.request("POST", f"/v2/models/{model_id}/infer", json=body)

    asked = [f"a{account[0]}", "nobody"]
    answer = infer({"name": "key", "datatype": "BYTES", "shape": [2], "data": asked})
    assert answer.status_code == 200, answer.text
    served = np.array(answer.json()["outputs"][0]["data"]).reshape(2, 2)
    json_answer = server.request(
        "POST", f"/models/{model_id}/predict", json={"X": X[:2].tolist(), "keys": asked}
    ).json()["predictions"]
    np.testing.assert_array_equal(served, json_answer)
    refused = infer(
        {"name": "key", "datatype": "BYTES", "shape": [2], "data": asked},
        {"unknown_keys": "error"},
    )
    assert refused.status_code == 422 and "'nobody'" in refused.text
    wrong = infer({"name": "key", "datatype": "INT64", "shape": [2], "data": ["a", "b"]})
    assert wrong.status_code == 400 and "needs 2 integers" in wrong.text
