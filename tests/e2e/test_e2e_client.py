"""The Python client (mixreg_client) against a real server: uploads, fits, predictions, errors,
retries, API keys, and the sync and async clients sharing one behaviour."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mixreg_client._core
from mixreg_client import AsyncClient, Client, Job, MixregError

from .conftest import REPO, Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

# A sub-sample search with far more partitions than it can try runs until it is cancelled.
LONG_FITS_ALLOWED = {"MIXREG_MAX_N_PARTITIONS": str(10**9)}
LONG_FIT_PARAMS = {"n_partitions": 10**9, "subsample_size": 30}

FAST_FIT = {"n_init": 4, "n_partitions": 50, "subsample_size": 30}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (SQLite) for the tests of this module."""
    yield from module_sqlite_server(tmp_path_factory, "client", **LONG_FITS_ALLOWED)


@pytest.fixture
def client(live: Server) -> Iterator[Client]:
    with Client(live.base_url) as client:
        yield client


def test_the_client_imports_without_the_servers_packages():
    code = (
        "import sys, mixreg_client\n"
        "heavy = ('mixreg', 'service', 'models_store', 'fastapi', 'sqlalchemy', 'pandas', "
        "'pyarrow', 'starlette', 'uvicorn')\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_upload_fit_wait_predict_and_list(client: Client, live: Server):
    X, y = mixture_data(n_rows=160, seed=8)
    dataset = client.upload(X, y, feature_names=["a", "b", "c"], name="arrays")
    assert (dataset.n_rows, dataset.n_features, dataset.feature_names) == (160, 3, ["a", "b", "c"])

    seen: list[Job] = []
    handle = client.fit(dataset, k=2, params=FAST_FIT, seed=3, name="client fit")
    job = handle.wait(progress=seen.append)

    assert job.status == "succeeded" and job.done and job.model_id is not None
    assert seen[-1] is job and handle.last is job
    fractions = [state.progress.fraction for state in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    model = handle.model()
    assert model.id == job.model_id and model.n_components == 2
    assert model.coef.shape == (2, 3) and model.feature_names == ["a", "b", "c"]

    predictions = client.predict(model, X)
    assert isinstance(predictions, np.ndarray) and predictions.shape == (160, 2)
    # Exactly the server's numbers, and the lines' own values.
    served = live.request("POST", "/predict", json={"model_id": model.id, "X": X.tolist()})
    np.testing.assert_array_equal(predictions, np.array(served.json()["predictions"]))
    np.testing.assert_allclose(predictions, X @ model.coef.T + model.intercept, rtol=1e-12)

    scores = client.score(model.id, X, y)
    best = predictions[np.arange(160), scores.best_component]
    np.testing.assert_allclose(scores.row_min_loss, (y - best) ** 2)
    assert scores.min_loss == pytest.approx(scores.row_min_loss.mean(), rel=1e-12)

    # Many rows go in several requests (each under the server's JSON predict limit): the same
    # numbers, and the min-loss the mean over all rows.
    with mock.patch.object(mixreg_client._core, "PREDICT_BODY_BYTES", 20 * 5 * 7):
        assert len(mixreg_client._core.row_batches(160, 3)) == 23
        np.testing.assert_array_equal(client.predict(model, X), predictions)
        batched = client.score(model.id, X, y)
    np.testing.assert_array_equal(batched.best_component, scores.best_component)
    assert batched.min_loss == pytest.approx(scores.min_loss, rel=1e-12)

    assert model.id in [summary.id for summary in client.list_models()]
    assert job.id in [listed.id for listed in client.list_jobs(status="succeeded")]
    assert client.get_dataset(dataset.id).name == "arrays"
    assert client.model_plot(model.id).startswith(b"\x89PNG")

    client.delete_model(model.id)
    with pytest.raises(MixregError) as deleted:
        client.get_model(model.id)
    assert deleted.value.status == 404
    assert deleted.value.detail == f"model {model.id} does not exist"


def test_dataframe_csv_and_parquet_uploads_give_the_same_data(client: Client, tmp_path: Path):
    X, y = mixture_data(n_rows=40, seed=2)
    frame = pd.DataFrame({"u": X[:, 0], "v": X[:, 1], "w": X[:, 2], "target": y})
    from_frame = client.upload(frame, target="target")
    csv_path = tmp_path / "data.csv"
    frame.to_csv(csv_path, index=False, float_format="%.17g")
    from_csv = client.upload(csv_path, target="target")
    parquet_path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pandas(frame), parquet_path)
    from_parquet = client.upload(str(parquet_path), target="target")

    for dataset in (from_frame, from_csv, from_parquet):
        assert dataset.n_rows == 40 and dataset.feature_names == ["u", "v", "w"]
        assert dataset.target_name == "target"
    # The same numbers in each: a fit of each with the same seed finds the same lines.
    models = [
        client.fit(dataset, k=2, params=FAST_FIT, seed=5).wait().model_id
        for dataset in (from_frame, from_csv, from_parquet)
    ]
    lines = [client.get_model(model_id).coef for model_id in models if model_id]
    assert len(lines) == 3
    np.testing.assert_array_equal(lines[0], lines[1])
    np.testing.assert_array_equal(lines[0], lines[2])

    with pytest.raises(ValueError, match="the DataFrame has no column 'y'; columns are u, v, w"):
        client.upload(frame, target="y")


def test_a_k_sweep_reports_every_k(client: Client):
    X, y = mixture_data(n_rows=120, seed=4)
    dataset = client.upload(X, y)
    job = client.fit(dataset, k=[1, 2, 3], params=FAST_FIT).wait()
    sweep = client.sweep(job.id)
    assert sweep is not None and job.sweep == sweep
    assert [entry.n_components for entry in sweep.models] == [1, 2, 3]
    assert sweep.best_n_components == 2 and job.model_id == sweep.models[1].model_id
    assert client.sweep_plot(job.id).startswith(b"\x89PNG")


def test_problems_raise_one_exception_with_the_problem(client: Client):
    dataset = client.upload(*mixture_data(n_rows=10))
    with pytest.raises(MixregError) as invalid:
        client.fit(dataset, k=0)
    problem = invalid.value
    assert problem.status == 422 and problem.title == "Unprocessable Entity"
    assert problem.detail == "k: Input should be greater than or equal to 1"
    assert [error["loc"] for error in problem.errors] == [["body", "k"]]
    assert problem.problem["type"] == "urn:mixreg:problem:validation-error"
    assert str(problem) == f"{problem.detail} (422 Unprocessable Entity)"

    with pytest.raises(MixregError) as too_many:
        client.fit(dataset, k=9)
    assert too_many.value.detail.startswith("k=9 is more than the 8 training rows")

    with pytest.raises(MixregError) as unknown:
        client.predict("f" * 32, [[1.0, 2.0, 3.0]])
    assert unknown.value.status == 404


def test_an_unreachable_server_is_a_mixreg_error():
    with Client("http://127.0.0.1:9", retries=1) as client, pytest.raises(MixregError) as error:
        client.list_models()
    assert error.value.status is None
    assert str(error.value).startswith("cannot reach the mixreg server at http://127.0.0.1:9")


class LoseFirstFitAnswer(httpx.BaseTransport):
    """Sends every request, but loses the answer of the first POST /fit (as a dropped
    connection would), and records what was sent."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[httpx.Request] = []
        self.lost = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = self.inner.handle_request(request)
        if request.url.path == "/fit" and not self.lost:
            self.lost = True
            response.read()
            raise httpx.ReadError("connection lost before the answer", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_fit_retried_after_a_lost_answer_is_queued_once(live: Server):
    transport = LoseFirstFitAnswer()
    with Client(live.base_url, transport=transport) as client:
        dataset = client.upload(*mixture_data(n_rows=30))
        before = live.request("GET", "/jobs").json()["total"]
        handle = client.fit(dataset, k=2, params=FAST_FIT)
    posts = [request for request in transport.sent if request.url.path == "/fit"]
    assert len(posts) == 2  # the first answer was lost, so the client sent it again
    keys = {request.headers["Idempotency-Key"] for request in posts}
    assert len(keys) == 1  # with the same key: the server answers with the same job
    assert live.request("GET", "/jobs").json()["total"] == before + 1
    assert live.job(handle.id)["status"] in ("queued", "running", "succeeded")


def test_the_async_client_does_what_the_sync_client_does(live: Server):
    X, y = mixture_data(n_rows=80, seed=6)

    async def scenario() -> tuple[np.ndarray, str, int | None]:
        async with AsyncClient(live.base_url) as client:
            dataset = await client.upload(X, y)
            handle = await client.fit(dataset, k=2, params=FAST_FIT, seed=2)
            fractions: list[float] = []
            job = await handle.wait(
                progress=lambda state: fractions.append(state.progress.fraction)
            )
            assert fractions[-1] == 1.0
            assert job.model_id is not None
            predictions = await client.predict(job.model_id, X)
            try:
                await client.get_job("0" * 32)
            except MixregError as exc:
                return predictions, job.model_id, exc.status
            return predictions, job.model_id, None

    predictions, model_id, status = asyncio.run(scenario())
    assert status == 404
    with Client(live.base_url) as client:
        np.testing.assert_array_equal(predictions, client.predict(model_id, X))


def test_cancel_stops_a_running_fit(client: Client):
    dataset = client.upload(*mixture_data(n_rows=400))
    handle = client.fit(
        dataset, k=2, algorithm="subsample", params=LONG_FIT_PARAMS, time_budget_s=3000
    )
    deadline = time.monotonic() + 30
    while handle.refresh().status == "queued":
        assert time.monotonic() < deadline, "the fit never started"
        time.sleep(0.05)
    assert handle.last.status == "running"
    cancelled = handle.cancel()
    assert cancelled.raw["cancel_requested"] is True
    assert handle.wait(timeout=60).status == "cancelled"
    # Cancelling a finished job changes nothing and raises nothing.
    assert handle.cancel().status == "cancelled"


class Recording(httpx.BaseTransport):
    """Sends every request and keeps it, to see the headers the client sent."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_the_api_key_is_sent_as_a_bearer_token(live: Server, monkeypatch: pytest.MonkeyPatch):
    recording = Recording()
    with Client(live.base_url, api_key="mixreg_abc_secret", transport=recording) as client:
        client.list_models()
    monkeypatch.setenv("MIXREG_API_KEY", "mixreg_from_environment")
    with Client(live.base_url, transport=recording) as client:
        client.list_jobs()
    assert [request.headers["Authorization"] for request in recording.sent] == [
        "Bearer mixreg_abc_secret",
        "Bearer mixreg_from_environment",
    ]


def test_a_dataframe_is_matched_to_the_features_by_name(client: Client):
    X, y = mixture_data(n_rows=60, seed=6)
    frame = pd.DataFrame({"year": X[:, 0], "action": X[:, 1], "runtime_h": X[:, 2], "y": y})
    model = client.get_model(
        client.fit(client.upload(frame, target="y"), k=2, params=FAST_FIT).wait().model_id or ""
    )
    in_order = client.predict(model, X)

    shuffled = frame[["runtime_h", "year", "action"]]
    # By name whether the model is given by id (its features are read) or as a Model.
    np.testing.assert_array_equal(client.predict(model.id, shuffled), in_order)
    np.testing.assert_array_equal(client.predict(model, shuffled), in_order)
    assert client.score(model.id, shuffled, y).min_loss == client.score(model, X, y).min_loss

    with pytest.raises(ValueError, match="lacks the model's features 'runtime_h'") as missing:
        client.predict(model.id, frame[["year", "action"]])
    assert "the model's features are year, action, runtime_h" in str(missing.value)
    with pytest.raises(ValueError, match="has columns the model was not fitted on: 'y'"):
        client.predict(model.id, frame)


def test_the_client_finds_the_server_as_the_command_line_does(
    live: Server, monkeypatch: pytest.MonkeyPatch
):
    for variable in ("MIXREG_URL", "MIXREG_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MIXREG_HOST", "0.0.0.0")
    monkeypatch.setenv("MIXREG_PORT", str(live.port))
    with Client() as client:
        assert client.base_url == live.base_url
        client.list_models()
    monkeypatch.setenv("MIXREG_URL", "http://127.0.0.1:9")
    with Client(retries=0) as client, pytest.raises(MixregError) as unreachable:
        client.list_models()
    assert client.base_url == "http://127.0.0.1:9"
    assert "set its address with MIXREG_URL, or MIXREG_HOST and MIXREG_PORT" in str(
        unreachable.value
    )
    assert "--url" not in str(unreachable.value)


def test_uploads_choose_their_feature_columns(client: Client, tmp_path: Path):
    X, y = mixture_data(n_rows=30, seed=9)
    frame = pd.DataFrame(
        {"id": [f"r{i}" for i in range(30)], "a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y}
    )
    path = tmp_path / "export.csv"
    frame.to_csv(path, index=False, sep=";", float_format="%.17g")

    from_csv = client.upload(path, target="y", ignore=["id"], delimiter=";")
    from_frame = client.upload(frame, target="y", features=["c", "a"])
    assert from_csv.feature_names == ["a", "b", "c"]
    assert from_frame.feature_names == ["c", "a"]
    with pytest.raises(ValueError, match="features names 'zz', but the DataFrame has the"):
        client.upload(frame, target="y", features=["zz"])
    with pytest.raises(MixregError, match="features names 'zz', but CSV has the columns"):
        client.upload(path, target="y", features=["a", "zz"])
