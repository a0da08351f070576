"""The edge middleware over real HTTP: small JSON predictions answered before routing give
exactly the routed answers (plain, scored, gated, grouped and keyed models), and lose none of
the guarantees in front of them: the order of the checks, key scopes, a revoked key, the body
limits, the browser guard, request ids on answers and in the access lines, metrics, and the
OpenAPI description of the body."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.auth.keys import add_key, new_key, revoke_key
from tests.e2e.conftest import Server, mixture_data

pytestmark = pytest.mark.e2e

# Headers that differ between any two answers.
VARYING_HEADERS = {"date", "server", "x-request-id"}


def start(tmp_path: Path, **settings: str) -> Server:
    server = Server(
        database_url=f"sqlite:///{tmp_path / 'mixreg.db'}",
        log_path=tmp_path / "server.log",
        settings={"MIXREG_LOG_FORMAT": "json", **settings},
    )
    server.start()
    return server


def fitted_model(server: Server, body: dict[str, Any], **headers: str) -> str:
    response = server.request("POST", "/fit", json=body, headers=headers)
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    deadline = time.monotonic() + 120
    while True:
        job = server.request("GET", f"/jobs/{job_id}", headers=headers).json()
        if job["status"] not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["status"] == "succeeded", job
    model_id: str = job["model_id"]
    return model_id


def upload(server: Server, X: np.ndarray, y: np.ndarray, columns: dict[str, Any]) -> str:
    body = {"X": X.tolist(), "y": y.tolist(), "columns": columns}
    response = server.request("POST", "/datasets", json=body)
    assert response.status_code == 201, response.text
    dataset_id: str = response.json()["id"]
    return dataset_id


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server without keys (loopback clients only) with a plain, a gated, a grouped and a
    keyed model of k = 2 on three features."""
    server = start(tmp_path_factory.mktemp("keyless"))
    X, y = mixture_data(200, seed=3)
    rng = np.random.default_rng(4)
    columns = {
        "w": rng.uniform(-1, 1, size=len(y)).tolist(),
        "user": [f"user-{index % 20}" for index in range(len(y))],
        "account": [f"acct-{index % 5}" for index in range(len(y))],
    }
    dataset_id = upload(server, X, y, columns)
    models = {
        "plain": fitted_model(server, {"dataset_id": dataset_id, "k": 2, "seed": 1}),
        "gated": fitted_model(
            server, {"dataset_id": dataset_id, "k": 2, "seed": 1, "gating": ["w"]}
        ),
        "grouped": fitted_model(
            server,
            {"dataset_id": dataset_id, "k": 2, "algorithm": "em", "seed": 1, "groups": "user"},
        ),
        "keyed": fitted_model(
            server, {"dataset_id": dataset_id, "k": 2, "seed": 1, "split_by": "account"}
        ),
    }
    yield server, models
    server.stop()
    server.client.close()


def bodies(models: dict[str, str]) -> list[dict[str, Any]]:
    """Predict bodies: those the edge answers (plain rows, with y, keyed rows) and those it
    hands on (groups, concomitant values, a wrong width, an unknown model)."""
    rows = [[0.5, -1.25, 7.0], [1e-3, 2.0, -0.1], [-3.0, 0.0, 1e5]]
    plain, gated = models["plain"], models["gated"]
    grouped, keyed = models["grouped"], models["keyed"]
    return [
        {"model_id": plain, "X": rows[:1]},
        {"model_id": plain, "X": rows},
        {"model_id": plain, "X": rows, "y": [1.0, -2.0, 0.25]},
        {"model_id": plain, "X": [[1, 2, 3]]},
        {"model_id": gated, "X": rows, "concomitant": [[0.1], [0.2], [-0.9]]},
        {"model_id": gated, "X": rows},
        {"model_id": grouped, "X": rows[:2], "groups": ["user-3", "nobody"]},
        {"model_id": grouped, "X": rows},
        {"model_id": keyed, "X": rows[:1], "keys": ["acct-2"]},
        {"model_id": keyed, "X": rows, "keys": ["acct-1", "acct-4", "stranger"]},
        {"model_id": keyed, "X": rows[:1], "keys": ["stranger"], "unknown_keys": "error"},
        {"model_id": plain, "X": [[1.0, 2.0]]},
        {"model_id": "0" * 32, "X": rows[:1]},
    ]


def comparable(response: Any) -> tuple[int, bytes, dict[str, str]]:
    headers = {
        name: value for name, value in response.headers.items() if name not in VARYING_HEADERS
    }
    return response.status_code, response.content, headers


def test_the_edge_answers_exactly_as_the_routes_do(keyless):
    server, models = keyless
    json_type = {"content-type": "application/json"}
    for body in bodies(models):
        raw = json.dumps(body).encode()
        # Twice: the first may load the model, the second finds it cached.
        for _ in range(2):
            edge = server.request("POST", "/predict", content=raw, headers=json_type)
            # A query string sends the same request through routing and serve_predict.
            routed = server.request(
                "POST", "/predict?output=predictions", content=raw, headers=json_type
            )
            assert comparable(edge) == comparable(routed), body
            assert edge.headers["x-request-id"] != routed.headers["x-request-id"]
        if edge.status_code == 200 and "concomitant" not in body:
            model_id = body.pop("model_id")
            by_path = server.request("POST", f"/models/{model_id}/predict", json=body)
            assert by_path.content == edge.content, body
    answered = [
        server.request("POST", "/predict", json=body).status_code for body in bodies(models)
    ]
    assert answered == [200] * 5 + [422] + [200] * 4 + [422, 422, 404]


def log_lines(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def test_access_lines_carry_the_request_ids_of_edge_answers(keyless):
    server, models = keyless
    sent = {f"edge-{index}": 200 for index in range(20)}
    for request_id in sent:
        response = server.request(
            "POST",
            "/predict",
            json={"model_id": models["plain"], "X": [[1.0, 2.0, 3.0]]},
            headers={"X-Request-ID": request_id},
        )
        assert response.status_code == 200
        assert response.headers["X-Request-ID"] == request_id
    missing = server.request(
        "POST",
        "/predict",
        json={"model_id": "0" * 32, "X": [[1.0, 2.0, 3.0]]},
        headers={"X-Request-ID": "edge-missing"},
    )
    assert missing.status_code == 404 and missing.headers["X-Request-ID"] == "edge-missing"
    sent["edge-missing"] = 404
    # The edge's lines are written in batches, within a fraction of a second.
    deadline = time.monotonic() + 5
    while True:
        access = {
            line["request_id"]: line
            for line in log_lines(server)
            if line["logger"] == "uvicorn.access" and str(line["request_id"]).startswith("edge-")
        }
        if len(access) == len(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert {request_id: line["status"] for request_id, line in access.items()} == sent
    assert {(line["method"], line["path"]) for line in access.values()} == {("POST", "/predict")}
    # One line per request: uvicorn's own access line is not written besides the edge's.
    lines = [line for line in log_lines(server) if line["request_id"] == "edge-3"]
    assert len(lines) == 1, lines


def test_metrics_count_edge_answers_under_their_route(keyless):
    server, models = keyless
    before = server.request("GET", "/metrics").text
    for _ in range(3):
        server.request(
            "POST", "/predict", json={"model_id": models["plain"], "X": [[1.0, 2.0, 3.0]]}
        )
    after = server.request("GET", "/metrics").text

    def count(text: str) -> float:
        for line in text.splitlines():
            if line.startswith(
                'mixreg_http_requests_total{method="POST",route="/predict",status="200"}'
            ):
                return float(line.split()[-1])
        return 0.0

    assert count(after) - count(before) == 3


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server requiring keys (a write and a read key), with a small JSON predict limit and
    one plain model."""
    tmp_path = tmp_path_factory.mktemp("keys")
    key_file = tmp_path / "api-keys.json"
    write, read = new_key(scope="write"), new_key(scope="read")
    add_key(key_file, write.record)
    add_key(key_file, read.record)
    server = start(
        tmp_path,
        MIXREG_API_KEYS_FILE=str(key_file),
        MIXREG_MAX_PREDICT_JSON_BYTES="2000",
        MIXREG_MAX_BODY_BYTES="4000",
    )
    writer = {"Authorization": f"Bearer {write.key}"}
    X, y = mixture_data(40, seed=5)
    # Few digits: the upload is within the small MIXREG_MAX_BODY_BYTES too.
    response = server.request(
        "POST",
        "/datasets",
        json={"X": X.round(3).tolist(), "y": y.round(3).tolist()},
        headers=writer,
    )
    assert response.status_code == 201, response.text
    model_id = fitted_model(server, {"dataset_id": response.json()["id"], "k": 2}, **writer)
    yield {
        "server": server,
        "model_id": model_id,
        "write": write,
        "read": read,
        "key_file": key_file,
    }
    server.stop()
    server.client.close()


def test_scopes_limits_and_the_browser_guard_hold_on_the_predict_path(keyed):
    server: Server = keyed["server"]
    body = {"model_id": keyed["model_id"], "X": [[0.5, 1.0, -1.0]]}
    read = {"Authorization": f"Bearer {keyed['read'].key}"}

    def predict(payload: Any = body, **headers: str) -> Any:
        return server.request("POST", "/predict", json=payload, headers=headers)

    assert predict(**read).status_code == 200
    assert predict(**read).status_code == 200  # a key verified before
    assert predict().status_code == 401
    wrong = keyed["read"].key[:-4] + ("AAAA" if not keyed["read"].key.endswith("AAAA") else "BBBB")
    assert predict(Authorization=f"Bearer {wrong}").status_code == 401
    assert predict(Authorization=f"Basic {keyed['read'].key}").status_code == 401
    # A cross-site write or a foreign Host is refused before the key is looked at.
    assert predict(Origin="https://evil.example", **read).status_code == 403
    assert predict(**{"Sec-Fetch-Site": "cross-site"}, **read).status_code == 403
    assert predict(Host="evil.example").status_code == 400
    # MIXREG_MAX_PREDICT_JSON_BYTES (2000) and MIXREG_MAX_BODY_BYTES (4000).
    rows = {"model_id": keyed["model_id"], "X": [[0.123456789, 1.23456789, 2.5]] * 80}
    assert len(json.dumps(rows)) > 2000
    too_big = predict(rows, **read)
    assert too_big.status_code == 413, too_big.text
    assert "MIXREG_MAX_PREDICT_JSON_BYTES" in too_big.json()["detail"]
    huge = {"model_id": keyed["model_id"], "X": [[0.123456789, 1.23456789, 2.5]] * 150}
    too_huge = predict(huge, **read)
    assert too_huge.status_code == 413 and "MIXREG_MAX_BODY_BYTES" in too_huge.json()["detail"]
    # No key and a body over the limit: the key is checked first.
    assert predict(huge).status_code == 401
    # Every refusal carries its request id.
    refused = predict(**{"X-Request-ID": "refused-1"})
    assert refused.headers["X-Request-ID"] == "refused-1"
    # A revoked key is refused at once, though it was verified before.
    revoke_key(keyed["key_file"], keyed["read"].record.id)
    revoked = predict(**read)
    assert revoked.status_code == 401 and "revoked" in revoked.json()["detail"]


def test_the_openapi_document_still_describes_the_predict_body(keyed):
    server: Server = keyed["server"]
    document = server.request("GET", "/openapi.json").json()
    operation = document["paths"]["/predict"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"model_id", "X"} <= set(schema["properties"]), schema
    assert {"application/x-npy", "application/x-npz"} <= set(operation["requestBody"]["content"])
