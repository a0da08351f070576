"""Predict bodies that ask for much with little: an ``.npz`` is bounded by the headers of its
arrays before anything is decompressed, a JSON body by its size, and an answer by every value
it holds (a gated model's probabilities, a group's posteriors), each a 4xx naming the setting."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings

MAX_PREDICT_VALUES = 100
MAX_PREDICT_JSON_BYTES = 20_000
MAX_BODY_BYTES = 2_000_000
NPZ = "application/x-npz"
NPY = "application/x-npy"


@pytest.fixture
def settings(migrated_database_url: str) -> Settings:
    """Small limits: an answer of at most 100 values, JSON predict bodies of 20 kB and bodies
    of 2 MB."""
    return Settings(
        database_url=migrated_database_url,
        embedded_worker=False,
        max_predict_values=MAX_PREDICT_VALUES,
        max_predict_json_bytes=MAX_PREDICT_JSON_BYTES,
        max_body_bytes=MAX_BODY_BYTES,
    )


def problem(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    detail: str = response.json()["detail"]
    return detail


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def post_npz(client: TestClient, model_id: str, body: bytes):
    return client.post(f"/predict?model_id={model_id}", content=body, headers={"content-type": NPZ})


def fitted(client: TestClient, run_queued_jobs, body: dict) -> str:
    response = client.post("/fit", json=body)
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    model_id: str = client.get(response.json()["url"]).json()["model_id"]
    return model_id


# --- .npz bodies: their headers are checked before their data are decompressed --------------


def test_an_npz_of_more_rows_than_the_answer_may_hold_is_refused_by_its_header(
    client: TestClient, model_id: str
):
    # 5,000,000 rows of zeros compress to a few hundred kilobytes.
    body = npz(X=np.zeros((5_000_000, 2)), keys=np.zeros(5_000_000, dtype=np.int64))
    assert len(body) < MAX_BODY_BYTES
    detail = problem(post_npz(client, model_id, body), 413)
    assert detail.startswith("the .npz array X has 5,000,000 rows: the answer would hold ")
    assert "MIXREG_MAX_PREDICT_VALUES" in detail


def test_an_npz_that_decompresses_beyond_the_body_limit_names_its_arrays(
    client: TestClient, model_id: str
):
    # 50 rows (100 predictions: within the answer's limit) of 1,000 features, with text keys
    # 10,000 characters wide: 2.4 MB decompressed, from an archive of a few kilobytes.
    body = npz(X=np.zeros((50, 1000)), keys=np.full(50, "k", dtype="<U10000"))
    assert len(body) < 50_000
    detail = problem(post_npz(client, model_id, body), 413)
    assert detail == (
        "the .npz arrays take 2,400,000 bytes decompressed (X 50 x 1,000 as float64: 400,000; "
        "keys 50 of <U10000: 2,000,000); at most 2,000,000 are accepted "
        "(MIXREG_MAX_BODY_BYTES); send fewer rows per request"
    )


def _npy_member(shape: tuple[int, ...], data: bytes, dtype: str = "<f8") -> bytes:
    """A ``.npy`` file whose header declares ``shape`` but that holds ``data``."""
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def _archive(members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return raw.getvalue()


def test_npz_members_that_lie_about_their_size_are_422s(client: TestClient, model_id: str):
    keys = _npy_member((2,), np.array([1, 2], dtype="<i8").tobytes(), dtype="<i8")
    # More data than the header declares: decompressed only up to what it declares.
    longer = _npy_member((2, 2), np.zeros(100_000).tobytes())
    detail = problem(post_npz(client, model_id, _archive({"X.npy": longer, "keys.npy": keys})), 422)
    assert detail == "the .npz array X holds more than the 32 bytes of data its header declares"
    # Less data than the header declares.
    shorter = _npy_member((200, 2), np.zeros(4).tobytes())
    keys = _npy_member((200,), np.zeros(200, dtype="<i8").tobytes(), dtype="<i8")
    detail = problem(
        post_npz(client, model_id, _archive({"X.npy": shorter, "keys.npy": keys})), 422
    )
    assert detail == (
        "the .npz array X declares shape (200, 2) of float64 (3,200 bytes) but holds only 32 bytes"
    )
    # A key array of another length than X is named once the sizes are known to be small.
    keys = _npy_member((3,), np.zeros(3, dtype="<i8").tobytes(), dtype="<i8")
    good_X = _npy_member((2, 2), np.zeros(4).tobytes())
    detail = problem(post_npz(client, model_id, _archive({"X.npy": good_X, "keys.npy": keys})), 422)
    assert "one key per row of X (2), got shape (3,) of int64" in detail


# --- JSON bodies: bounded by their size, binary formats pointed to ---------------------------


def test_a_json_predict_body_beyond_its_limit_is_a_413_pointing_to_binary_formats(
    client: TestClient, model_id: str
):
    X = np.random.default_rng(2).standard_normal((1000, 2))
    body = f'{{"model_id": "{model_id}", "X": {X.tolist()}}}'.encode()
    assert len(body) > MAX_PREDICT_JSON_BYTES
    expected = (
        f"the JSON body takes {len(body):,} bytes; a JSON predict body may take at most "
        f"{MAX_PREDICT_JSON_BYTES:,} (MIXREG_MAX_PREDICT_JSON_BYTES); send big batches as "
        "application/x-npy (an .npy array of rows; application/x-npz with keys) or as binary "
        "tensors of the Open Inference Protocol (/v2/models/{model_id}/infer)"
    )
    headers = {"content-type": "application/json"}
    assert problem(client.post("/predict", content=body, headers=headers), 413) == expected
    # Sent in chunks, without a Content-Length: counted once received.
    chunked = client.post("/predict", content=iter([body[:10_000], body[10_000:]]), headers=headers)
    assert problem(chunked, 413) == expected
    # The same rows as .npy are answered.
    as_npy = client.post(
        f"/predict?model_id={model_id}", content=npy(X[:50]), headers={"content-type": NPY}
    )
    assert as_npy.status_code == 200, as_npy.text
    # And a JSON body within the limit.
    small = client.post("/predict", json={"model_id": model_id, "X": X[:50].tolist()})
    assert small.status_code == 200, small.text


# --- answers: every value they hold counts ----------------------------------------------------


def test_a_gated_answer_counts_its_probabilities_and_values_per_row(
    client: TestClient, run_queued_jobs, noisy_data
):
    X, y = noisy_data
    model_id = fitted(
        client,
        run_queued_jobs,
        {
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "em",
            "gating": "features",
            "seed": 1,
        },
    )
    # 40 rows: 80 predictions, within 100; with the probabilities (80) and the expected value,
    # most likely value and component (120), 280 values.
    rows = X[:40].tolist()
    detail = problem(client.post("/predict", json={"model_id": model_id, "X": rows}), 413)
    assert detail == (
        "the answer would hold 280 values (40 rows x (k = 2 for each of predictions, "
        "probabilities + 1 for each of expected, most_likely, most_likely_component)); at most "
        "100 are answered (MIXREG_MAX_PREDICT_VALUES); send at most 14 rows per request"
    )
    assert client.post("/predict", json={"model_id": model_id, "X": rows[:14]}).is_success
    # An .npy answer holds one output: 60 rows of the expected value are 60 values.
    for output, rows_answered in (("expected", 60), ("probabilities", 50)):
        response = client.post(
            f"/predict?model_id={model_id}&output={output}",
            content=npy(X[:rows_answered]),
            headers={"content-type": NPY, "accept": NPY},
        )
        assert response.status_code == 200, response.text
    too_many = client.post(
        f"/predict?model_id={model_id}&output=probabilities",
        content=npy(X[:51]),
        headers={"content-type": NPY, "accept": NPY},
    )
    assert "the .npy body has 51 rows: the answer would hold 102 values" in problem(too_many, 413)
    # The Open Inference Protocol answers every output unless asked for some.
    tensor = {"name": "X", "shape": [40, 2], "datatype": "FP64", "data": X[:40].ravel().tolist()}
    every_output = client.post(f"/v2/models/{model_id}/infer", json={"inputs": [tensor]})
    assert "the answer would hold 280 values" in problem(every_output, 413)
    predictions_only = client.post(
        f"/v2/models/{model_id}/infer",
        json={"inputs": [tensor], "outputs": [{"name": "predictions"}]},
    )
    assert predictions_only.status_code == 200, predictions_only.text


def test_a_grouped_answer_counts_the_posteriors_of_its_groups(
    client: TestClient, run_queued_jobs, noisy_data
):
    X, y = noisy_data
    labels = [f"user-{row // 5}" for row in range(len(X))]
    dataset = client.post(
        "/datasets",
        json={"X": X.tolist(), "y": y.tolist(), "columns": {"user": labels}},
    )
    assert dataset.status_code == 201, dataset.text
    model_id = fitted(
        client,
        run_queued_jobs,
        {"dataset_id": dataset.json()["id"], "k": 2, "algorithm": "em", "groups": "user"},
    )
    # 30 rows: 60 predictions; with their groups also 60 posteriors and 30 lines: 150 values.
    body = {"model_id": model_id, "X": X[:30].tolist(), "groups": labels[:30]}
    detail = problem(client.post("/predict", json=body), 413)
    assert detail.startswith(
        "the answer would hold 150 values (30 rows x (k = 2 for each of predictions, "
        "group_posterior + 1 for each of group_line)); at most 100 are answered"
    )
    body = {"model_id": model_id, "X": X[:20].tolist(), "groups": labels[:20]}
    assert client.post("/predict", json=body).is_success
    # Without groups the same 30 rows hold 60 values.
    assert client.post("/predict", json={"model_id": model_id, "X": X[:30].tolist()}).is_success
