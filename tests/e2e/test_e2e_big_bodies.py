"""Big request bodies do not hold up small requests: a big JSON dataset, or a fit with big
inline data, is parsed off the event loop while single-row predictions keep being answered.
Big predict bodies are refused before they cost: a small ``.npz`` that decompresses to
hundreds of megabytes by the headers of its arrays, a big JSON body by its size."""

from __future__ import annotations

import io
import json
import statistics
import threading
import time

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import Server, ServerFactory, proc_status_mb, reset_peak_mb

pytestmark = pytest.mark.e2e


def predict_latencies(
    client: httpx.Client, model_id: str, *, until: threading.Event | None, n: int
):
    """Seconds taken by single-row predictions sent one after the other: ``n`` of them, or
    until ``until`` is set."""
    seconds = []
    while (until is None and len(seconds) < n) or (until is not None and not until.is_set()):
        sent = time.monotonic()
        response = client.post("/predict", json={"model_id": model_id, "X": [[0.5]]})
        seconds.append(time.monotonic() - sent)
        assert response.status_code == 200, response.text
    return seconds


def predicts_during(server: Server, model_id: str, path: str, body: bytes):
    """Single-row prediction latencies before (50 of them) and while ``body`` is posted to
    ``path``; the big request's answer and how long it took."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        baseline = predict_latencies(client, model_id, until=None, n=50)
        posted = threading.Event()
        answers: list[httpx.Response] = []

        def post() -> None:
            with httpx.Client(base_url=server.base_url, timeout=120) as poster:
                answers.append(
                    poster.post(path, content=body, headers={"content-type": "application/json"})
                )
            posted.set()

        poster = threading.Thread(target=post)
        started = time.monotonic()
        poster.start()
        during = predict_latencies(client, model_id, until=posted, n=0)
        poster.join()
        post_seconds = time.monotonic() - started
    (answer,) = answers
    return baseline, during, answer, post_seconds


def assert_no_predict_waited(baseline, during, post_seconds) -> None:
    # Loosely, as the machine may be busy: no prediction waited for the parse, which is most of
    # the post's time; the longest wait is jitter, small beside the post and beside what
    # single-row predictions take anyway.
    typical = statistics.median(baseline)
    longest = max(during)
    assert longest < max(1.0, 20 * typical, 0.3 * post_seconds), (
        longest,
        typical,
        post_seconds,
    )


def small_model(server: Server, rng: np.random.Generator) -> str:
    X = rng.standard_normal((40, 1))
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": X[:, 0].tolist()}, "k": 2})
    )
    model_id: str = job["model_id"]
    return model_id


def test_single_row_predicts_answer_while_a_big_json_dataset_is_parsed(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rng = np.random.default_rng(0)
    model_id = small_model(server, rng)
    # About 40 MB of JSON: seconds of parsing.
    big_X = rng.standard_normal((300_000, 5))
    big_body = json.dumps({"X": big_X.tolist(), "y": big_X[:, 0].tolist()}).encode()

    baseline, during, answer, post_seconds = predicts_during(
        server, model_id, "/datasets", big_body
    )

    assert answer.status_code == 201, answer.text
    assert answer.json()["n_rows"] == 300_000
    assert_no_predict_waited(baseline, during, post_seconds)


def test_single_row_predicts_answer_while_a_fit_with_big_inline_data_is_parsed(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rng = np.random.default_rng(1)
    model_id = small_model(server, rng)
    big_X = rng.standard_normal((300_000, 5))
    big_y = big_X @ np.arange(1.0, 6.0)
    big_body = json.dumps(
        {
            "data": {"X": big_X.tolist(), "y": big_y.tolist()},
            "k": 1,
            "algorithm": "am-classic",
            "holdout_fraction": 0,
        }
    ).encode()

    baseline, during, answer, post_seconds = predicts_during(server, model_id, "/fit", big_body)

    assert answer.status_code == 202, answer.text
    assert_no_predict_waited(baseline, during, post_seconds)
    # The inline rows were stored and fitted as sent.
    job = server.wait_for_job(answer.json()["job_id"], timeout=120)
    assert job["status"] == "succeeded", job
    dataset = server.request("GET", f"/datasets/{job['dataset_id']}").json()
    assert (dataset["n_rows"], dataset["n_features"]) == (300_000, 5)
    model = server.request("GET", f"/models/{job['model_id']}").json()
    np.testing.assert_allclose(model["components"][0]["coef"], np.arange(1.0, 6.0), atol=1e-9)


def test_a_big_fit_body_that_does_not_validate_is_a_422_naming_the_field(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rows = [[0.5, 1.5]] * 20_000
    body = {"data": {"X": rows, "y": [1.0] * 19_999}, "k": 2}
    answer = server.request("POST", "/fit", json=body)
    assert answer.status_code == 422, answer.text
    assert "y has 19999 values but X has 20000 rows" in answer.json()["detail"]
    body = {"data": {"X": rows, "y": [1.0] * 20_000}, "k": 0}
    answer = server.request("POST", "/fit", json=body)
    assert answer.status_code == 422, answer.text
    assert [error["loc"] for error in answer.json()["errors"]] == [["body", "k"]]


def post_measured(server: Server, path: str, body: bytes, content_type: str):
    """Post ``body``, polling ``/healthz`` meanwhile: the answer, the server's peak resident
    memory growth (MB) and the slowest ``/healthz`` (s)."""
    assert server.process is not None
    pid = server.process.pid
    before = reset_peak_mb(pid)
    done = threading.Event()
    probes: list[float] = []

    def probe() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as prober:
            while not done.is_set():
                sent = time.monotonic()
                assert prober.get("/healthz").status_code == 200
                probes.append(time.monotonic() - sent)
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            answer = client.post(path, content=body, headers={"content-type": content_type})
    finally:
        done.set()
        prober.join()
    return answer, proc_status_mb(pid, "VmHWM") - before, max(probes, default=0.0)


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def test_a_small_npz_of_many_rows_is_refused_by_its_headers_without_decompressing(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    model_id = small_model(server, np.random.default_rng(2))
    # About 400 kB that decompress to 440 MB: more rows than the answer may hold (k = 2).
    many_rows = npz(X=np.zeros((5_000_000, 10)), keys=np.zeros(5_000_000, dtype=np.int64))
    assert len(many_rows) < 500_000
    answer, growth_mb, _ = post_measured(
        server, f"/predict?model_id={model_id}", many_rows, "application/x-npz"
    )
    assert answer.status_code == 413, answer.text
    assert growth_mb < 50, f"the server's peak grew by {growth_mb:.0f} MB"
    detail = answer.json()["detail"]
    assert detail.startswith("the .npz array X has 5,000,000 rows: the answer would hold")
    assert "MIXREG_MAX_PREDICT_VALUES" in detail
    # Rows the answer may hold, but 176 MB decompressed: beyond what a body may take.
    wide = npz(X=np.zeros((2_000_000, 10)), keys=np.zeros(2_000_000, dtype=np.int64))
    answer, growth_mb, _ = post_measured(
        server, f"/models/{model_id}/predict", wide, "application/x-npz"
    )
    assert growth_mb < 50, f"the server's peak grew by {growth_mb:.0f} MB"
    assert answer.status_code == 413, answer.text
    assert answer.json()["detail"].startswith(
        "the .npz arrays take 176,000,000 bytes decompressed (X 2,000,000 x 10 as float64: "
        "160,000,000; keys 2,000,000 of int64: 16,000,000); at most 67,108,864 are accepted "
        "(MIXREG_MAX_BODY_BYTES)"
    )


def test_a_big_json_predict_body_is_refused_by_its_size_and_healthz_stays_quick(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    model_id = small_model(server, np.random.default_rng(3))
    X = np.random.default_rng(4).standard_normal((750_000, 1))
    body = json.dumps({"model_id": model_id, "X": X.tolist()}).encode()
    assert len(body) > 15_000_000
    answer, growth_mb, slowest_healthz = post_measured(server, "/predict", body, "application/json")
    assert answer.status_code == 413, answer.text
    detail = answer.json()["detail"]
    assert "(MIXREG_MAX_PREDICT_JSON_BYTES)" in detail
    assert "application/x-npy" in detail
    # Refused from its Content-Length: nothing parsed, so nothing held up.
    assert slowest_healthz < 0.5
    assert growth_mb < 50, f"the server's peak grew by {growth_mb:.0f} MB"
    # The same rows as .npy are answered.
    buffer = io.BytesIO()
    np.save(buffer, X)
    as_npy = server.request(
        "POST",
        f"/models/{model_id}/predict",
        content=buffer.getvalue(),
        headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
    )
    assert as_npy.status_code == 200, as_npy.text
    assert np.load(io.BytesIO(as_npy.content)).shape == (750_000, 2)
