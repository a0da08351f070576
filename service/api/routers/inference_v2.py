"""The Open Inference Protocol (KServe v2 / Triton HTTP): health, metadata and inference.

Off-the-shelf clients work unchanged, e.g. ``tritonclient.http.InferenceServerClient``: a model
is named by its id (one version, ``1``), by a registered model's name (its versions; the latest
when none is given) or by ``name@alias``; its input is ``X`` (``[n, d]``, FP64 or FP32) and its
output ``predictions`` (``[n, k]``, FP64). Errors are problem+json with the protocol's ``error``
member.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from models_store import registry
from models_store.session import session_scope
from service import limits
from service.api.errors import status_of
from service.api.routers import health
from service.config import Settings
from service.data import model_references
from service.errors import ServiceError
from service.problems import PROBLEM_MEDIA_TYPE, problem_response
from service.schemas_v2 import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
)
from service.serving import inference_v2
from service.serving.endpoint import INLINE_ANSWER_VALUES, INLINE_BODY_BYTES, lines_of
from service.serving.prediction import StoredLines

router = APIRouter(prefix="/v2", tags=["inference"])

ModelId = Annotated[
    str,
    Path(description="a model id, a registered model's name, or name@alias (the model name)"),
]
Version = Annotated[
    str,
    Path(description="a registered model's version; a model named by its id has only '1'"),
]

SERVER_EXTENSIONS = ["binary_tensor_data"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "a request the protocol or the model cannot serve"},
    404: {"description": "no such model (or version)"},
}
_INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": InferenceRequest.model_json_schema()},
            inference_v2.BINARY_MEDIA_TYPE: {
                "schema": {"type": "string", "format": "binary"},
                "description": "binary tensor data extension: the JSON header (its length in "
                "the Inference-Header-Content-Length header), then each input with "
                "parameters.binary_data_size as raw little-endian bytes",
            },
        },
    }
}
_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the predictions; with binary output, the JSON header (its length in "
        "Inference-Header-Content-Length) followed by the raw float64 predictions",
        "content": {inference_v2.BINARY_MEDIA_TYPE: {"schema": {"type": "string"}}},
    },
    **_ERRORS,
}


def _problem(request: Request, error: ServiceError) -> JSONResponse:
    """The problem+json answer to ``error``, with the protocol's ``error`` member."""
    status = status_of(error)
    problem = problem_response(
        status=status, detail=error.detail, instance=request.url.path, slug=error.slug
    )
    body = json.loads(bytes(problem.body))
    body["error"] = error.detail
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE)


def _reference(model_name: str, version: str | None) -> str:
    """The model reference of the protocol's model name and version."""
    if version is None:
        return model_name
    parsed = model_references.parse_reference(model_name)
    if parsed.model_id is not None:
        inference_v2.check_version(model_name, version)
        return model_name
    if parsed.alias is not None or parsed.version is not None:
        raise inference_v2.VersionNotFoundError(
            f"model {model_name} already names one version; address a version as "
            f"/v2/models/{parsed.name}/versions/N"
        )
    if not version.isascii() or not version.isdigit() or len(version) > 9:
        raise inference_v2.VersionNotFoundError(
            f"registered model {model_name} has no version '{version[:40]}'; versions are "
            f"numbers 1, 2, 3, ..."
        )
    return f"{model_name}/versions/{int(version)}"


async def _lines(request: Request, model_name: str, version: str | None) -> StoredLines:
    return await lines_of(request, _reference(model_name, version))


def _versions(request: Request, lines: StoredLines) -> list[str] | None:
    """Every version of the registered model ``lines`` is a version of (None for others)."""
    if lines.registered_model is None:
        return None
    with session_scope(request.app.state.session_factory) as session:
        rows = registry.list_versions(
            session, name=lines.registered_model, before_version=None, limit=MAX_LISTED_VERSIONS
        )
        return [str(row.version) for row in reversed(rows)]


MAX_LISTED_VERSIONS = 1000
"""The newest versions listed in a registered model's metadata at most."""


@router.get("/health/live", response_class=Response, responses={200: {"description": "live"}})
async def live() -> Response:
    """The server is up (200, empty body)."""
    return Response(status_code=200)


@router.get(
    "/health/ready",
    response_class=Response,
    responses={200: {"description": "ready"}, 503: {"description": "not ready"}},
)
async def ready(request: Request) -> Response:
    """The server can serve (200, empty body): the same checks as ``/readyz``."""
    state = request.app.state
    settings: Settings = state.settings
    result = await run_in_threadpool(
        health.readyz, request, state.session_factory, settings, state.task_queue, None
    )
    if isinstance(result, Response):
        return result
    return Response(status_code=200)


@router.get("", response_model=ServerMetadata)
async def server_metadata(request: Request) -> ServerMetadata:
    """The server's name, version and protocol extensions."""
    return ServerMetadata(name="mixreg", version=request.app.version, extensions=SERVER_EXTENSIONS)


@router.get("/models/{model_id}", response_model=ModelMetadata, responses=_ERRORS)
async def model_metadata(request: Request, model_id: ModelId) -> ModelMetadata | JSONResponse:
    """The model's input (``X``, ``[-1, d]``) and output (``predictions``, ``[-1, k]``)."""
    return await _metadata(request, model_id, None)


@router.get(
    "/models/{model_id}/versions/{version}", response_model=ModelMetadata, responses=_ERRORS
)
async def model_version_metadata(
    request: Request, model_id: ModelId, version: Version
) -> ModelMetadata | JSONResponse:
    """The metadata of the model's only version, ``1``."""
    return await _metadata(request, model_id, version)


async def _metadata(
    request: Request, model_id: str, version: str | None
) -> ModelMetadata | JSONResponse:
    try:
        lines = await _lines(request, model_id, version)
        versions = await run_in_threadpool(_versions, request, lines)
        return inference_v2.model_metadata(lines, name=model_id, versions=versions)
    except ServiceError as error:
        return _problem(request, error)


@router.get("/models/{model_id}/ready", response_class=Response, responses=_ERRORS)
async def model_ready(request: Request, model_id: ModelId) -> Response:
    """200 (empty body) when the model can serve, 404 when it does not exist."""
    return await _ready(request, model_id, None)


@router.get(
    "/models/{model_id}/versions/{version}/ready", response_class=Response, responses=_ERRORS
)
async def model_version_ready(request: Request, model_id: ModelId, version: Version) -> Response:
    """200 (empty body) when the model's version can serve."""
    return await _ready(request, model_id, version)


async def _ready(request: Request, model_id: str, version: str | None) -> Response:
    try:
        await _lines(request, model_id, version)
    except ServiceError as error:
        return _problem(request, error)
    return Response(status_code=200)


@router.post(
    "/models/{model_id}/infer",
    response_model=InferenceResponse,
    responses=_INFER_RESPONSES,
    openapi_extra=_INFER_BODY,
)
async def infer(request: Request, model_id: ModelId) -> Response:
    """k predictions per row of the input ``X``, as the output ``predictions``."""
    return await _infer(request, model_id, None)


@router.post(
    "/models/{model_id}/versions/{version}/infer",
    response_model=InferenceResponse,
    responses=_INFER_RESPONSES,
    openapi_extra=_INFER_BODY,
)
async def infer_version(request: Request, model_id: ModelId, version: Version) -> Response:
    """Inference with the model's only version, ``1``."""
    return await _infer(request, model_id, version)


async def _infer(request: Request, model_id: str, version: str | None) -> Response:
    try:
        lines = await _lines(request, model_id, version)
        body = await request.body()
        header, binary = inference_v2.split_body(
            body, request.headers.get(inference_v2.HEADER_LENGTH)
        )
        if len(body) <= INLINE_BODY_BYTES:
            parsed = inference_v2.read_inference(lines, header, binary)
        else:
            parsed = await run_in_threadpool(inference_v2.read_inference, lines, header, binary)
        settings: Settings = request.app.state.settings
        limits.check_data_shape(*parsed.X.shape, settings=settings, what="input X")
        # Every output asked counts: a gated model's probabilities are k values per row too.
        names = [name for name, _ in parsed.outputs]
        limits.check_answer_size(
            parsed.X.shape[0],
            lines.n_components,
            settings=settings,
            matrices=[name for name in names if name in inference_v2.MATRIX_OUTPUTS],
            vectors=[name for name in names if name not in inference_v2.MATRIX_OUTPUTS],
        )
        answer_values = parsed.X.shape[0] * lines.coef.shape[0]
        if len(body) <= INLINE_BODY_BYTES and answer_values <= INLINE_ANSWER_VALUES:
            content, header_length = inference_v2.infer(lines, parsed, name=model_id)
        else:
            content, header_length = await run_in_threadpool(
                inference_v2.infer, lines, parsed, name=model_id
            )
    except ServiceError as error:
        return _problem(request, error)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content,
        media_type=inference_v2.BINARY_MEDIA_TYPE,
        headers={inference_v2.HEADER_LENGTH: str(header_length)},
    )
