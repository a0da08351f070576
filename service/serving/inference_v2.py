"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST API) for fitted models.

A model is named by its id, and then has one version, ``"1"``; or by a registered model's name,
whose versions are its registered versions (the latest when none is given), or by
``name@alias``. It has one input, ``X``: an FP64 (or
FP32, or integer) tensor of shape ``[n, d]``; and one output, ``predictions``: an FP64 tensor
of shape ``[n, k]``, one value per line for each row. A gated model has four more outputs,
selectable by name like ``predictions`` (all of them when a request names none):
``probabilities`` (FP64 ``[n, k]``), ``expected`` and ``most_likely`` (FP64 ``[n]``) and
``most_likely_component`` (INT64 ``[n]``); when its gate reads dataset columns it takes a second
input, ``concomitant`` (``[n, q]``, the columns in the order of the model's gate).

Tensors travel as JSON (``"data"``, flat in row-major order or nested) or, with the protocol's
binary tensor data extension, as raw little-endian bytes after the JSON header, whose length is
given by the ``Inference-Header-Content-Length`` header. A response carries its output in
binary when the request's output asks for ``"binary_data": true`` or the request's parameters
set ``"binary_data_output": true`` (as off-the-shelf clients do by default).

Errors are problem+json documents whose ``error`` member repeats the ``detail``, the field
clients of the protocol read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from service import checks
from service.errors import NotFoundError, ServiceError
from service.schemas_v2 import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    ModelMetadata,
    RequestInput,
    ResponseOutput,
)
from service.serving.prediction import (
    FloatArray,
    StoredLines,
    gate_columns,
    predict_gated,
    predict_rows,
)

MODEL_VERSION = "1"
INPUT_NAME = "X"
KEY_INPUT_NAME = "key"
"""A keyed model's second input: each row's key, BYTES (text) or INT64, as JSON data."""
OUTPUT_NAME = "predictions"
MATRIX_OUTPUTS = (OUTPUT_NAME, "probabilities")
"""The outputs of k values per row; the others have one value per row."""
CONCOMITANT_NAME = "concomitant"
GATED_OUTPUTS = {
    "probabilities": "FP64",
    "expected": "FP64",
    "most_likely": "FP64",
    "most_likely_component": "INT64",
}
PLATFORM = "mixreg"
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_MEDIA_TYPE = "application/octet-stream"

# Datatypes an input may have, as little-endian numpy dtypes; every one is read as float64.
INPUT_DATATYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in {
        "FP64": "<f8",
        "FP32": "<f4",
        "FP16": "<f2",
        "INT64": "<i8",
        "INT32": "<i4",
        "INT16": "<i2",
        "INT8": "i1",
        "UINT64": "<u8",
        "UINT32": "<u4",
        "UINT16": "<u2",
        "UINT8": "u1",
    }.items()
}


class InferenceProtocolError(ServiceError):
    """An inference request the protocol or the model cannot serve (a bad request)."""

    slug = "inference-request"


def served_version(lines: StoredLines) -> str:
    """The protocol's version of ``lines``: its registered version, else ``"1"``."""
    return MODEL_VERSION if lines.version is None else str(lines.version)


def model_metadata(
    lines: StoredLines, *, name: str | None = None, versions: list[str] | None = None
) -> ModelMetadata:
    """What a client needs to call the model: its input and output tensors. ``name`` is the
    name the client used (default the model id), ``versions`` those it has (default the one
    that answers)."""
    n_components = int(lines.coef.shape[0])
    inputs = [MetadataTensor(name=INPUT_NAME, datatype="FP64", shape=[-1, lines.n_features])]
    outputs = [MetadataTensor(name=OUTPUT_NAME, datatype="FP64", shape=[-1, n_components])]
    if lines.gate is not None:
        if lines.gate.concomitant is not None:
            inputs.append(
                MetadataTensor(
                    name=CONCOMITANT_NAME, datatype="FP64", shape=[-1, len(lines.gate.concomitant)]
                )
            )
        outputs += [
            MetadataTensor(
                name=output,
                datatype=datatype,
                shape=[-1, n_components] if output == "probabilities" else [-1],
            )
            for output, datatype in GATED_OUTPUTS.items()
        ]
    return ModelMetadata(
        name=lines.model_id if name is None else name,
        versions=[served_version(lines)] if versions is None else versions,
        platform=PLATFORM,
        inputs=inputs,
        outputs=outputs,
    )


def _input_names(lines: StoredLines) -> list[str]:
    if lines.keyed is not None:
        return [INPUT_NAME, KEY_INPUT_NAME]
    if lines.gate is not None and lines.gate.concomitant is not None:
        return [INPUT_NAME, CONCOMITANT_NAME]
    return [INPUT_NAME]


def _output_names(lines: StoredLines) -> list[str]:
    return [OUTPUT_NAME, *(GATED_OUTPUTS if lines.gate is not None else ())]


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "none"


def check_version(model_id: str, version: str | None) -> None:
    """Raise ``VersionNotFoundError`` (404) unless ``version`` is absent or the only one."""
    if version is not None and version != MODEL_VERSION:
        raise VersionNotFoundError(
            f"model {model_id} has no version '{version}'; its only version is '{MODEL_VERSION}'"
        )


class VersionNotFoundError(NotFoundError):
    """The model exists but not in the version asked for."""


@dataclass(frozen=True)
class ParsedInference:
    """An inference request: its JSON header, the rows of its input, how to answer."""

    request: InferenceRequest
    X: FloatArray
    outputs: list[tuple[str, bool]]
    """The outputs to answer, in order, each with whether it travels as binary data."""
    concomitant: FloatArray | None = None
    keys: list[str | int] | None = None
    unknown_keys: str = "global"

    @property
    def binary_output(self) -> bool:
        """Whether the answer carries binary data after its JSON header."""
        return any(binary for _, binary in self.outputs)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tensor data of a request body."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise InferenceProtocolError(
            f"{HEADER_LENGTH} must be a number of bytes, got '{header_length}'"
        ) from None
    if not 0 < length <= len(body):
        raise InferenceProtocolError(
            f"{HEADER_LENGTH} is {length} but the body holds {len(body)} bytes; it must give "
            f"the length of the JSON header at the start of the body"
        )
    return body[:length], body[length:]


def parse_request(header: bytes) -> InferenceRequest:
    """The JSON header of an inference request, checked by its schema."""
    if not header.strip():
        raise InferenceProtocolError("the inference request is empty; send a JSON header")
    try:
        return InferenceRequest.model_validate_json(header)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = first["msg"] if not where else f"{where}: {first['msg']}"
        if first["type"] == "json_invalid":
            message = f"the inference request header is not valid JSON: {first['msg']}"
        raise InferenceProtocolError(message) from None


def read_inference(lines: StoredLines, header: bytes, binary: bytes) -> ParsedInference:
    """Check an inference request against the model and read its input rows."""
    request = parse_request(header)
    expected = _input_names(lines)
    has = [tensor.name for tensor in request.inputs]
    if len(expected) == 1 and len(has) != 1:
        raise InferenceProtocolError(
            f"model {lines.model_id} has one input, '{INPUT_NAME}'; the request has {_quoted(has)}"
        )
    if len(expected) == 1 and has != expected:
        raise InferenceProtocolError(
            f"model {lines.model_id} has one input, '{INPUT_NAME}'; the request sends '{has[0]}'"
        )
    if sorted(has) != sorted(expected):
        raise InferenceProtocolError(
            f"model {lines.model_id} has the inputs {_quoted(expected)}; the request has "
            f"{_quoted(has)}"
        )
    tensors = {tensor.name: tensor for tensor in request.inputs}
    parts = _binary_parts(request.inputs, binary)
    X = _input_rows(
        tensors[INPUT_NAME], parts[INPUT_NAME], n_features=lines.n_features, model_id=lines.model_id
    )
    concomitant = None
    if CONCOMITANT_NAME in tensors:
        assert lines.gate is not None and lines.gate.concomitant is not None
        concomitant = _input_rows(
            tensors[CONCOMITANT_NAME],
            parts[CONCOMITANT_NAME],
            n_features=len(lines.gate.concomitant),
            model_id=lines.model_id,
            columns="gate columns",
        )
        if concomitant.shape[0] != X.shape[0]:
            raise InferenceProtocolError(
                f"input '{CONCOMITANT_NAME}' has {concomitant.shape[0]} rows but '{INPUT_NAME}' "
                f"has {X.shape[0]}"
            )
    keys, unknown_keys = None, "global"
    if KEY_INPUT_NAME in tensors:
        keys = _input_keys(tensors[KEY_INPUT_NAME], n_rows=X.shape[0])
        unknown_keys = (request.parameters or {}).get("unknown_keys", "global")
        if unknown_keys not in ("global", "error"):
            raise InferenceProtocolError(
                f"parameters.unknown_keys is {unknown_keys!r}; send 'global' or 'error'"
            )
    return ParsedInference(
        request=request,
        X=X,
        outputs=_outputs(request, lines),
        concomitant=concomitant,
        keys=keys,
        unknown_keys=unknown_keys,
    )


def _binary_parts(inputs: list[RequestInput], binary: bytes) -> dict[str, bytes]:
    """Each input's share of the binary data, in the order of the inputs (a single input gets
    it all, so its size is checked against the whole)."""
    if len(inputs) == 1:
        return {inputs[0].name: binary}
    parts: dict[str, bytes] = {}
    offset = 0
    for tensor in inputs:
        size = (tensor.parameters or {}).get("binary_data_size")
        length = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0
        parts[tensor.name] = binary[offset : offset + length]
        offset += length
    if offset < len(binary):
        raise InferenceProtocolError(
            f"the body has {len(binary)} bytes after the JSON header but the inputs' "
            f"binary_data_size add up to {offset}"
        )
    return parts


def _input_keys(tensor: RequestInput, *, n_rows: int) -> list[str | int]:
    """The keys of the ``key`` input: BYTES (text) or INT64 JSON data, one per row."""
    if tensor.datatype not in ("BYTES", "INT64"):
        raise InferenceProtocolError(
            f"input '{tensor.name}' has datatype {tensor.datatype}; send BYTES or INT64 keys"
        )
    if tensor.shape not in ([n_rows], [n_rows, 1]):
        raise InferenceProtocolError(
            f"input '{tensor.name}' has shape {tensor.shape}; send [{n_rows}], a key per row"
        )
    if tensor.data is None or (tensor.parameters or {}).get("binary_data_size") is not None:
        raise InferenceProtocolError(f"input '{tensor.name}': send the keys as JSON data")
    flat = [item[0] if isinstance(item, list) and len(item) == 1 else item for item in tensor.data]
    kind = str if tensor.datatype == "BYTES" else int
    if len(flat) != n_rows or not all(type(item) is kind for item in flat):
        raise InferenceProtocolError(
            f"input '{tensor.name}' of datatype {tensor.datatype} needs {n_rows} "
            f"{'strings' if kind is str else 'integers'}"
        )
    keys: list[str | int] = flat
    return keys


def _input_rows(
    tensor: RequestInput,
    binary: bytes,
    *,
    n_features: int,
    model_id: str,
    columns: str = "features",
) -> FloatArray:
    dtype = INPUT_DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise InferenceProtocolError(
            f"input '{tensor.name}' has datatype {tensor.datatype}; send FP64 or FP32 (or "
            f"an integer type)"
        )
    if len(tensor.shape) != 2 or tensor.shape[1] != n_features:
        raise InferenceProtocolError(
            f"input '{tensor.name}' has shape {tensor.shape}; model {model_id} takes "
            f"[n, {n_features}]: n rows of {n_features} {columns}"
        )
    n_rows = tensor.shape[0]
    if n_rows < 1:
        raise InferenceProtocolError(f"input '{tensor.name}' has no rows (shape {tensor.shape})")
    count = n_rows * n_features
    binary_size = (tensor.parameters or {}).get("binary_data_size")
    if binary_size is not None:
        values = _binary_values(tensor, binary, binary_size, dtype=dtype, count=count)
    else:
        if binary:
            raise InferenceProtocolError(
                f"the body has {len(binary)} bytes after the JSON header but input "
                f"'{tensor.name}' gives no binary_data_size"
            )
        values = _json_values(tensor, count=count, dtype=dtype)
    X = np.ascontiguousarray(values.reshape(n_rows, n_features), dtype=np.float64)
    try:
        checks.check_finite_matrix(X, name=tensor.name)
    except checks.IngestError as exc:
        raise InferenceProtocolError(str(exc)) from None
    return X


def _binary_values(
    tensor: RequestInput, binary: bytes, size: Any, *, dtype: np.dtype[Any], count: int
) -> NDArray[Any]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InferenceProtocolError(
            f"input '{tensor.name}': binary_data_size must be a number of bytes, got {size!r}"
        )
    expected = count * dtype.itemsize
    if size != expected:
        raise InferenceProtocolError(
            f"input '{tensor.name}' of shape {tensor.shape} and datatype {tensor.datatype} "
            f"needs {expected} bytes, but binary_data_size is {size}"
        )
    if len(binary) != size:
        raise InferenceProtocolError(
            f"input '{tensor.name}' announces {size} bytes of binary data but the body holds "
            f"{len(binary)} after the JSON header"
        )
    return np.frombuffer(binary, dtype=dtype, count=count)


def _json_values(tensor: RequestInput, *, count: int, dtype: np.dtype[Any]) -> NDArray[Any]:
    if tensor.data is None:
        raise InferenceProtocolError(
            f"input '{tensor.name}' has neither data nor parameters.binary_data_size"
        )
    flat = _flatten(tensor.data, name=tensor.name)
    if len(flat) != count:
        raise InferenceProtocolError(
            f"input '{tensor.name}' of shape {tensor.shape} needs {count} values, got {len(flat)}"
        )
    try:
        values = np.array(flat, dtype=np.float64)
    except OverflowError:
        raise InferenceProtocolError(
            f"input '{tensor.name}' holds an integer too large for a float64"
        ) from None
    if dtype.kind in "iu" and not np.array_equal(values, np.floor(values)):
        raise InferenceProtocolError(
            f"input '{tensor.name}' has datatype {tensor.datatype} but holds non-integers"
        )
    return values


def _flatten(data: list[Any], *, name: str) -> list[float]:
    """The values of a flat or nested (row-major) ``data`` list; only numbers are allowed."""
    flat: list[float] = []
    stack: list[Any] = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        elif isinstance(item, int | float) and not isinstance(item, bool):
            flat.append(item)
        else:
            raise InferenceProtocolError(
                f"input '{name}' holds {type(item).__name__} {item!r}; its data must be numbers"
            )
    return flat


_END = object()


def _outputs(request: InferenceRequest, lines: StoredLines) -> list[tuple[str, bool]]:
    """The outputs the request asks for (every output when it names none), each with whether
    it travels as binary data."""
    default = bool((request.parameters or {}).get("binary_data_output", False))
    available = _output_names(lines)
    if request.outputs is None:
        return [(name, default) for name in available]
    asked = [output.name for output in request.outputs]
    if not asked or not set(asked) <= set(available) or len(set(asked)) != len(asked):
        has = (
            f"one output, '{OUTPUT_NAME}'"
            if len(available) == 1
            else f"the outputs {_quoted(available)}"
        )
        raise InferenceProtocolError(f"the model has {has}; the request asks for {_quoted(asked)}")
    return [
        (output.name, bool((output.parameters or {}).get("binary_data", default)))
        for output in request.outputs
    ]


def infer(
    lines: StoredLines, parsed: ParsedInference, *, name: str | None = None
) -> tuple[bytes, int | None]:
    """Predict and encode the response: the body and, for binary output, the length of its JSON
    header (for ``Inference-Header-Content-Length``). ``name`` is the model's name as the
    client gave it (default its id); the response names the version that answered."""
    predictions = predict_rows(lines, parsed.X, parsed.keys, unknown_keys=parsed.unknown_keys)
    values: dict[str, NDArray[Any]] = {OUTPUT_NAME: predictions}
    if lines.gate is not None:
        gated = predict_gated(lines, predictions, gate_columns(lines, parsed.X, parsed.concomitant))
        values |= {output: getattr(gated, output) for output in GATED_OUTPUTS}
    outputs, raw_parts = [], []
    for output_name, binary in parsed.outputs:
        array = values[output_name]
        datatype = GATED_OUTPUTS.get(output_name, "FP64")
        output = ResponseOutput(
            name=output_name, datatype=datatype, shape=[int(size) for size in array.shape]
        )
        if binary:
            raw_part = np.ascontiguousarray(array, dtype="<f8" if datatype == "FP64" else "<i8")
            raw_parts.append(raw_part.tobytes())
            output.parameters = {"binary_data_size": len(raw_parts[-1])}
        else:
            output.data = array.ravel().tolist()
        outputs.append(output)
    raw = b"".join(raw_parts)
    response = InferenceResponse(
        model_name=lines.model_id if name is None else name,
        model_version=served_version(lines),
        id=parsed.request.id,
        outputs=outputs,
    )
    header = response.model_dump_json(exclude_none=True).encode()
    if not parsed.binary_output:
        return header, None
    return header + raw, len(header)
