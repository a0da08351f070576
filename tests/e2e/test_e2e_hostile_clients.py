"""Hostile clients and big answers against a real server: Host names and cross-site writes,
what the open readiness probe tells, idempotency keys per caller, the job quota under concurrent
submissions (PostgreSQL), a 4 MB CSV header, and predict answers bounded by a setting."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.auth.keys import environment_entry, new_key
from tests.e2e.conftest import Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

FAST_FIT = {"k": 2, "algorithm": "am-classic", "params": {"n_init": 2}, "seed": 1}
MAX_PREDICT_VALUES = 100


def fit_body(**overrides: object) -> dict[str, object]:
    X, y = mixture_data(n_rows=60)
    return {"data": {"X": X.tolist(), "y": y.tolist()}, **FAST_FIT, **overrides}


def csv_file(n_rows: int = 40) -> bytes:
    X, y = mixture_data(n_rows=n_rows)
    rows = np.column_stack([X, y])
    lines = ["a,b,c,y"] + [",".join(repr(float(value)) for value in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def assert_problem(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    for fragment in fragments:
        assert fragment in response.json()["detail"]


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server without keys on SQLite, answering at most 100 predictions per request."""
    yield from module_sqlite_server(
        tmp_path_factory, "keyless", MIXREG_MAX_PREDICT_VALUES=str(MAX_PREDICT_VALUES)
    )


def test_only_allowed_host_names_are_answered(keyless: Server):
    refused = keyless.request("GET", "/jobs", headers={"Host": "evil.example"})
    assert_problem(refused, 400, "'evil.example'", "MIXREG_ALLOWED_HOSTS")
    rebound = keyless.request("GET", "/datasets", headers={"Host": f"evil.example:{keyless.port}"})
    assert rebound.status_code == 400
    for host in (f"127.0.0.1:{keyless.port}", f"localhost:{keyless.port}", "[::1]"):
        assert keyless.request("GET", "/jobs", headers={"Host": host}).status_code == 200
    # Probes are called by address by orchestrators, and hold nothing.
    assert keyless.request("GET", "/healthz", headers={"Host": "10.0.0.7:8000"}).status_code == 200


def test_a_page_on_another_site_cannot_write(keyless: Server):
    def upload(**headers: str) -> httpx.Response:
        return keyless.request(
            "POST",
            "/datasets",
            files={"file": ("data.csv", csv_file(), "text/csv")},
            data={"target": "y"},
            headers=headers,
        )

    before = keyless.request("GET", "/datasets").json()["total"]
    assert_problem(upload(Origin="http://evil.example"), 403, "'http://evil.example'")
    assert_problem(upload(Origin="null"), 403)
    assert_problem(upload(**{"Sec-Fetch-Site": "cross-site"}), 403, "Sec-Fetch-Site")
    assert_problem(upload(Origin=f"http://127.0.0.1:{keyless.port + 1}"), 403)
    assert keyless.request("GET", "/datasets").json()["total"] == before
    # The server's own pages (the docs' "Try it out"), and clients that send no Origin, may.
    assert upload(Origin=keyless.base_url, **{"Sec-Fetch-Site": "same-origin"}).status_code == 201
    assert upload().status_code == 201
    # Reads are not refused: without CORS headers the page cannot read the answer anyway.
    assert keyless.request("GET", "/jobs", headers={"Origin": "http://evil.example"}).is_success


def test_the_readiness_probe_shows_details_to_a_client_on_this_machine(keyless: Server):
    ready = keyless.request("GET", "/readyz").json()
    assert ready["status"] == "ready"
    assert (ready["worker"], ready["database_revision"] is not None) == ("embedded", True)


def test_a_wide_csv_header_is_refused_at_once(keyless: Server):
    header = ",".join(f"feature_{index:06d}" for index in range(300_000)) + ",y\n"
    assert len(header) > 4_000_000
    started = time.monotonic()
    refused = keyless.request(
        "POST",
        "/datasets",
        params={"target": "y"},
        content=(header + "1,2\n").encode(),
        headers={"Content-Type": "text/csv"},
    )
    assert time.monotonic() - started < 20
    assert_problem(refused, 413, "300,000 features", "MIXREG_MAX_FEATURES")


def test_predict_answers_are_bounded_in_every_format(keyless: Server):
    job = keyless.wait_for_job(keyless.fit(fit_body()))
    model_id = job["model_id"]
    rows = (MAX_PREDICT_VALUES // 2) + 1  # k = 2: one row too many
    X = np.ones((rows, 3))
    refused = keyless.request("POST", "/predict", json={"model_id": model_id, "X": X.tolist()})
    assert_problem(refused, 413, f"{2 * rows} predictions", "MIXREG_MAX_PREDICT_VALUES")
    buffer = io.BytesIO()
    np.save(buffer, X.astype(np.int8))
    as_npy = keyless.request(
        "POST",
        f"/models/{model_id}/predict",
        content=buffer.getvalue(),
        headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
    )
    assert_problem(as_npy, 413, "MIXREG_MAX_PREDICT_VALUES")
    infer = {
        "inputs": [
            {"name": "X", "shape": [rows, 3], "datatype": "FP64", "data": X.ravel().tolist()}
        ]
    }
    for binary in (False, True):
        body = {
            **infer,
            "outputs": [{"name": "predictions", "parameters": {"binary_data": binary}}],
        }
        answer = keyless.request("POST", f"/v2/models/{model_id}/infer", json=body)
        assert_problem(answer, 413, "MIXREG_MAX_PREDICT_VALUES")
    allowed = keyless.request("POST", "/predict", json={"model_id": model_id, "X": X[:-1].tolist()})
    assert allowed.status_code == 200
    assert np.asarray(allowed.json()["predictions"]).shape == (rows - 1, 2)


# --- with keys ----------------------------------------------------------------------------


def start_keyed(database_url: str, folder: Path, **settings: str) -> tuple[Server, dict[str, str]]:
    """A server that requires keys; the bearer headers of keys a, b (write) and reader (read)."""
    made = {
        name: new_key(scope=scope)
        for name, scope in (("a", "write"), ("b", "write"), ("reader", "read"))
    }
    server = Server(
        database_url=database_url,
        log_path=folder / "server.log",
        settings={
            "MIXREG_API_KEYS": ",".join(environment_entry(key.record) for key in made.values()),
            "MIXREG_MAX_QUEUED_JOBS_PER_KEY": "3",
            **settings,
        },
    )
    server.start()
    return server, {name: f"Bearer {key.key}" for name, key in made.items()}


@pytest.fixture
def keyed(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server that requires keys, on SQLite, and its keys' bearer headers."""
    server, keys = start_keyed(sqlite_url, tmp_path)
    yield server, keys
    server.stop()
    server.client.close()


def test_an_idempotency_key_belongs_to_the_caller_that_sent_it(keyed):
    server, keys = keyed
    as_a = {"Authorization": keys["a"], "Idempotency-Key": "nightly"}
    as_b = {"Authorization": keys["b"], "Idempotency-Key": "nightly"}
    first = server.request("POST", "/fit", json=fit_body(), headers=as_a)
    assert first.status_code == 202
    of_b = server.request("POST", "/fit", json=fit_body(), headers=as_b)
    assert of_b.status_code == 202 and "idempotent-replayed" not in of_b.headers
    assert of_b.json()["job_id"] != first.json()["job_id"]
    # Each caller's retries find its own job; another body under A's key is A's conflict only.
    again = server.request("POST", "/fit", json=fit_body(), headers=as_b)
    assert (again.json()["job_id"], again.headers["idempotent-replayed"]) == (
        of_b.json()["job_id"],
        "true",
    )
    assert_problem(
        server.request("POST", "/fit", json=fit_body(seed=2), headers=as_a),
        409,
        first.json()["job_id"],
    )
    with_other_body = server.request(
        "POST", "/fit", json=fit_body(seed=3), headers={**as_b, "Idempotency-Key": "weekly"}
    )
    assert with_other_body.status_code == 202

    def upload(headers: dict[str, str]) -> httpx.Response:
        return server.request(
            "POST",
            "/datasets",
            files={"file": ("data.csv", csv_file(), "text/csv")},
            data={"target": "y"},
            headers=headers,
        )

    dataset_a, dataset_b = upload(as_a), upload(as_b)
    assert (dataset_a.status_code, dataset_b.status_code) == (201, 201)
    assert dataset_a.json()["id"] != dataset_b.json()["id"]
    assert upload(as_b).json()["id"] == dataset_b.json()["id"]


def test_details_of_readiness_and_workers_need_a_key_that_may_see_them(keyed):
    server, keys = keyed
    anonymous = server.request("GET", "/readyz")
    assert anonymous.json() == {
        "status": "ready",
        "database_revision": None,
        "worker": None,
        "queue": None,
    }
    detailed = server.request("GET", "/readyz", headers={"Authorization": keys["reader"]}).json()
    assert (detailed["worker"], detailed["database_revision"] is not None) == ("embedded", True)
    # A wrong key on the open probe is not refused, and shows nothing more.
    wrong = server.request("GET", "/readyz", headers={"Authorization": "Bearer nonsense"})
    assert (wrong.status_code, wrong.json()["worker"]) == (200, None)

    submitted = server.request(
        "POST", "/fit", json=fit_body(), headers={"Authorization": keys["a"]}
    )
    job_id = submitted.json()["job_id"]
    deadline = time.monotonic() + 60
    while True:
        job = server.request("GET", f"/jobs/{job_id}", headers={"Authorization": keys["a"]}).json()
        if job["status"] == "succeeded" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert job["status"] == "succeeded"
    assert isinstance(job["worker_id"], str) and job["worker_id"]
    as_reader = server.request("GET", f"/jobs/{job_id}", headers={"Authorization": keys["reader"]})
    assert as_reader.json()["worker_id"] is None
    listed = server.request("GET", "/jobs", headers={"Authorization": keys["reader"]}).json()
    assert [item["worker_id"] for item in listed["items"]] == [None]


def test_concurrent_fits_of_one_key_never_exceed_its_quota(postgres_url: str, tmp_path: Path):
    # On PostgreSQL concurrent transactions really overlap; the jobs stay queued.
    server, keys = start_keyed(postgres_url, tmp_path, MIXREG_EMBEDDED_WORKER="false")
    statuses: list[int] = []
    start = threading.Barrier(16)

    def submit() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            start.wait()
            response = client.post("/fit", json=fit_body(), headers={"Authorization": keys["a"]})
            statuses.append(response.status_code)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        listed = server.request("GET", "/jobs", headers={"Authorization": keys["a"]}).json()
    finally:
        server.stop()
        server.client.close()
    assert sorted(statuses) == [202] * 3 + [429] * 13
    assert listed["total"] == 3
