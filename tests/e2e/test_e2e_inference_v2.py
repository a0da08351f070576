"""The Open Inference Protocol over real HTTP, driven by Triton's own client
(``tritonclient.http``), and its request and response shapes checked on the wire."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from .conftest import Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

HEADER_LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "v2")


@pytest.fixture(scope="module")
def model_id(server: Server) -> str:
    X, y = mixture_data(n_rows=300, seed=2)
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am"})
    )
    assert job["status"] == "succeeded", job
    return str(job["model_id"])


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield client
    client.close()


def rest_predictions(server: Server, model_id: str, X: np.ndarray) -> np.ndarray:
    response = server.request("POST", f"/models/{model_id}/predict", json={"X": X.tolist()})
    assert response.status_code == 200, response.text
    return np.array(response.json()["predictions"])


def test_health_and_metadata_through_the_triton_client(
    client: triton.InferenceServerClient, model_id: str
):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(model_id)
    assert client.is_model_ready(model_id, model_version="1")
    assert not client.is_model_ready("0" * 32)
    assert not client.is_model_ready(model_id, model_version="2")
    server_metadata = client.get_server_metadata()
    assert server_metadata["name"] == "mixreg"
    assert "binary_tensor_data" in server_metadata["extensions"]
    assert client.get_model_metadata(model_id) == {
        "name": model_id,
        "versions": ["1"],
        "platform": "mixreg",
        "inputs": [{"name": "X", "datatype": "FP64", "shape": [-1, 3]}],
        "outputs": [{"name": "predictions", "datatype": "FP64", "shape": [-1, 2]}],
    }


@pytest.mark.parametrize("binary_input", [True, False])
@pytest.mark.parametrize("binary_output", [True, False, None])
def test_inference_through_the_triton_client_equals_the_rest_predictions(
    server: Server, client: triton.InferenceServerClient, model_id: str, binary_input, binary_output
):
    X, _ = mixture_data(n_rows=50, seed=3)
    tensor = triton.InferInput("X", list(X.shape), "FP64")
    tensor.set_data_from_numpy(X, binary_data=binary_input)
    outputs = (
        None
        if binary_output is None  # the client then asks for every output in binary
        else [triton.InferRequestedOutput("predictions", binary_data=binary_output)]
    )
    result = client.infer(model_id, [tensor], outputs=outputs, request_id="req-7")
    predictions = result.as_numpy("predictions")
    assert predictions.shape == (50, 2) and predictions.dtype == np.float64
    np.testing.assert_array_equal(predictions, rest_predictions(server, model_id, X))
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        model_id,
        "1",
        "req-7",
    )


def test_fp32_input_and_a_versioned_model(
    server: Server, client: triton.InferenceServerClient, model_id: str
):
    X, _ = mixture_data(n_rows=20, seed=4)
    single = X.astype(np.float32)
    tensor = triton.InferInput("X", list(X.shape), "FP32")
    tensor.set_data_from_numpy(single)
    predictions = client.infer(model_id, [tensor], model_version="1").as_numpy("predictions")
    expected = rest_predictions(server, model_id, single.astype(np.float64))
    np.testing.assert_array_equal(predictions, expected)


def _fp64_input(shape: list[int], data: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("X", shape, "FP64")
    tensor.set_data_from_numpy(data)
    return tensor


@pytest.mark.parametrize(
    ("make_inputs", "model", "version", "status", "message"),
    [
        (
            lambda: [_fp64_input([4, 2], np.ones((4, 2)))],
            None,
            "",
            "400",
            "input 'X' has shape [4, 2]; model {id} takes [n, 3]: n rows of 3 features",
        ),
        (
            lambda: [triton.InferInput("X", [2, 3], "BYTES")],
            None,
            "",
            "400",
            "input 'X' has datatype BYTES; send FP64 or FP32 (or an integer type)",
        ),
        (
            lambda: [_renamed()],
            None,
            "",
            "400",
            "model {id} has one input, 'X'; the request sends 'features'",
        ),
        (
            lambda: [_fp64_input([1, 3], np.array([[1.0, np.nan, 2.0]]))],
            None,
            "",
            "400",
            "X[0][1] is NaN; all values must be finite numbers",
        ),
        (lambda: [_fp64_input([1, 3], np.ones((1, 3)))], "f" * 32, "", "404", "model ffff"),
        (
            lambda: [_fp64_input([1, 3], np.ones((1, 3)))],
            None,
            "3",
            "404",
            "model {id} has no version '3'; its only version is '1'",
        ),
    ],
)
def test_bad_inference_requests_raise_in_the_triton_client(
    client: triton.InferenceServerClient, model_id, make_inputs, model, version, status, message
):
    inputs = make_inputs()
    if inputs[0].datatype() == "BYTES":
        inputs[0].set_data_from_numpy(np.array([b"a"] * 6, dtype=object).reshape(2, 3))
    with pytest.raises(InferenceServerException) as error:
        client.infer(model or model_id, inputs, model_version=version)
    assert error.value.status() == status
    assert error.value.message().startswith(message.format(id=model_id))


def _renamed() -> triton.InferInput:
    tensor = triton.InferInput("features", [2, 3], "FP64")
    tensor.set_data_from_numpy(np.ones((2, 3)))
    return tensor


def test_the_json_shapes_on_the_wire(server: Server, model_id: str):
    X, _ = mixture_data(n_rows=2, seed=5)
    body = {
        "id": "wire",
        "inputs": [{"name": "X", "shape": [2, 3], "datatype": "FP64", "data": X.tolist()}],
        "outputs": [{"name": "predictions"}],
    }
    response = server.request("POST", f"/v2/models/{model_id}/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert set(answer) == {"model_name", "model_version", "id", "outputs"}
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("predictions", "FP64", [2, 2])
    assert output["data"] == rest_predictions(server, model_id, X).ravel().tolist()  # row-major


def test_binary_bodies_on_the_wire(server: Server, model_id: str):
    X, _ = mixture_data(n_rows=3, seed=6)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [3, 3],
                    "datatype": "FP64",
                    "parameters": {"binary_data_size": 72},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    response = server.request(
        "POST",
        f"/v2/models/{model_id}/infer",
        content=header + X.astype("<f8").tobytes(),
        headers={HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers[HEADER_LENGTH])
    answer = json.loads(response.content[:length])
    (output,) = answer["outputs"]
    assert output["parameters"] == {"binary_data_size": 48} and "data" not in output
    predictions = np.frombuffer(response.content[length:], dtype="<f8").reshape(3, 2)
    np.testing.assert_array_equal(predictions, rest_predictions(server, model_id, X))


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b'{"inputs": []}', None, "model {id} has one input, 'X'; the request has none"),
        (b"{not json", None, "the inference request header is not valid JSON"),
        (b'{"inputs": [{"name": "X"}]}', None, "inputs.0.shape: Field required"),
        (
            b'{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP64", "data": [1, 2]}]}',
            None,
            "input 'X' of shape [1, 3] needs 3 values, got 2",
        ),
        (
            b'{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP64", '
            b'"data": [1, "a", 2]}]}',
            None,
            "input 'X' holds str 'a'; its data must be numbers",
        ),
        (
            (
                b'{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP64", '
                b'"parameters": {"binary_data_size": 24}}]}',
                b"\x00" * 16,
            ),
            "header",
            "input 'X' announces 24 bytes of binary data but the body holds 16",
        ),
        (
            (
                b'{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP64", '
                b'"parameters": {"binary_data_size": 16}}]}',
                b"\x00" * 16,
            ),
            "header",
            "input 'X' of shape [1, 3] and datatype FP64 needs 24 bytes",
        ),
        (b'{"inputs": []}', "999", "Inference-Header-Content-Length is 999 but the body holds"),
        (
            b'{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}], '
            b'"outputs": [{"name": "scores"}]}',
            None,
            "the model has one output, 'predictions'; the request asks for 'scores'",
        ),
    ],
)
def test_bad_requests_are_problems_with_the_protocols_error_member(
    server: Server, model_id: str, body, header_length, message
):
    headers = {"content-type": "application/json"}
    if header_length == "header":  # a JSON header followed by binary data
        header, binary = body
        body, header_length = header + binary, str(len(header))
    if header_length is not None:
        headers[HEADER_LENGTH] = header_length
    response = server.request("POST", f"/v2/models/{model_id}/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["error"] == problem["detail"]
    assert problem["detail"].startswith(message.format(id=model_id)), problem["detail"]
