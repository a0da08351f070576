"""Fitted models: list, inspect, delete, predict."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.convertors import Convertor, register_url_convertor

from models_store import models as model_store
from models_store import registry
from service.api import cursors
from service.api.deps import (
    MODEL_REFERENCE,
    ModelCacheDep,
    ReferenceResolverDep,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    ValidModel,
    ValidModelVersion,
)
from service.api.routers.predict import PREDICT_RESPONSES, predict_body
from service.data import model_references
from service.schemas import (
    MAX_OFFSET,
    KeyLines,
    ModelOut,
    ModelPredictRequest,
    ModelSummary,
    Page,
    PredictResponse,
)
from service.serving import exports, formats, prediction
from service.serving.endpoint import lines_of, serve_predict
from service.views import model_out, model_summary, model_url

router = APIRouter(prefix="/models", tags=["models"])

ARCHIVE_SPOOL_BYTES = 16 * 1024 * 1024
"""A keyed model's export archive up to this size is built in memory, a larger one on disk."""
ARCHIVE_BLOCK_BYTES = 1024 * 1024


class _ModelSegment(Convertor[str]):
    """A model reference as one path segment, except ``import``: ``/models/import`` is the
    import resource, so ``GET`` and ``DELETE`` there answer 405 instead of looking for a model
    called "import"."""

    regex = r"(?!import(?![^/]))[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model_segment", _ModelSegment())

ModelId = Annotated[str, Path(description=MODEL_REFERENCE)]
RegisteredName = Annotated[str, Path(description="a registered model's name")]
VersionNumber = Annotated[int, Path(description="its version number", ge=1, le=999_999_999)]


@router.get("", response_model=Page[ModelSummary])
def list_(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: cursors.CursorQuery = None,
) -> Page[ModelSummary]:
    """Fitted models, newest first."""
    after = cursors.page_key(cursor, offset=offset)
    rows, total = model_store.list_models(session, limit=limit + 1, offset=offset, after=after)
    models, next_cursor = cursors.next_page(rows, limit)
    versions = registry.versions_of_models(session, model_ids=[model.id for model in models])
    return Page[ModelSummary](
        items=[model_summary(model, versions.get(model.id)) for model in models],
        total=total,
        limit=limit,
        offset=offset,
        next_cursor=next_cursor,
    )


@router.get("/{model_id:model_segment}", response_model=ModelOut)
def get(model: ValidModel, session: SessionDep) -> ModelOut:
    """The θ list (coefficients and intercept per component), scores, baseline, provenance.

    The model is named by its id, ``name@alias``, or a registered model's name (its latest
    version)."""
    return model_out(model, registry.version_of_model(session, model_id=model.id))


IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            formats.JSON_MEDIA_TYPE: {
                "schema": {"type": "object", "description": "a model's JSON document"}
            },
            exports.ARCHIVE_MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "a keyed model's archive: model.json and its keys' arrays",
                }
            },
        },
    }
}


async def _raw_body(request: Request) -> bytes:
    return await request.body()


RawBody = Annotated[bytes, Depends(_raw_body)]


@router.post(
    "/import",
    status_code=201,
    response_model=ModelOut,
    responses={
        413: {"description": "a keyed model's arrays decode to more than the limit"},
        422: {"description": "the document lacks something, holds it wrong, or is too large"},
    },
    openapi_extra=IMPORT_BODY,
)
def import_(
    body: RawBody,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    registered_model: Annotated[
        str | None,
        Query(description="store the model as this registered model's next version"),
    ] = None,
) -> ModelOut:
    """Store a model from its export (from this or another server): the JSON document, or a
    keyed model's ``.zip`` archive (``Content-Type: application/zip``)."""
    if registered_model is not None:
        model_references.check_name(registered_model, what="registered_model")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == exports.ARCHIVE_MEDIA_TYPE:
        model, version = exports.import_archive(
            session, body, registered_model=registered_model, settings=settings
        )
    else:
        model, version = exports.import_document(
            session,
            exports.parse_json_document(body),
            registered_model=registered_model,
            settings=settings,
        )
    response.headers["Location"] = model_url(model.id)
    return model_out(model, version)


@router.get(
    "/{model_id}/export",
    responses={
        200: {
            "description": "the model's JSON document; of a keyed model, a zip archive of its "
            "document (model.json) and its keys' arrays (.npy)",
            "content": {
                exports.ARCHIVE_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
def export(model: ValidModel, session: SessionDep) -> Response:
    """The model as a self-describing JSON document: its lines, feature names, gate, metrics
    and provenance (never pickle), which ``POST /models/import`` and
    ``MixtureOfLinearRegressions.from_dict`` read back. A keyed model is a ``.zip`` archive:
    that document (``model.json``, with the key column) and every key's lines as ``.npy``
    arrays, which ``POST /models/import`` reads back."""
    version = registry.version_of_model(session, model_id=model.id)
    if model.split_by is None:
        document = exports.export_document(model, version)
        return Response(
            formats.json_bytes(document),
            media_type=formats.JSON_MEDIA_TYPE,
            headers={"Content-Disposition": f'attachment; filename="model-{model.id}.json"'},
        )
    keyed_arrays = model_store.load_keyed_arrays(session, model_id=model.id)
    document = exports.export_document(model, version, keyed_arrays)
    # Spooled: a large archive goes to a temporary file and out in blocks.
    # Closed by the response once sent (or below if writing fails), not by a with block.
    spool = tempfile.SpooledTemporaryFile(max_size=ARCHIVE_SPOOL_BYTES)  # noqa: SIM115
    try:
        exports.write_archive(document, exports.archive_arrays(keyed_arrays), spool)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return StreamingResponse(
        iter(lambda: spool.read(ARCHIVE_BLOCK_BYTES), b""),
        media_type=exports.ARCHIVE_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="model-{model.id}.zip"'},
        background=BackgroundTask(spool.close),
    )


@router.get(
    "/{model_id}/model.onnx",
    response_class=Response,
    responses={
        200: {
            "description": "an ONNX graph: input X [n, d] (and key [n] of a keyed model), "
            "output predictions [n, k]",
            "content": {
                exports.ONNX_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}
            },
        },
        409: {"description": "a keyed model's lines exceed what one ONNX file holds"},
    },
)
def onnx(
    model: ValidModel,
    session: SessionDep,
    dtype: Annotated[
        exports.OnnxType, Query(description="the element type of X and of the predictions")
    ] = "float64",
) -> Response:
    """The model as an ONNX graph that ONNX Runtime (or any ONNX runner) evaluates to the
    same predictions: input ``X`` ``[n, d]``, output ``predictions`` ``[n, k]``. A keyed
    model's graph has a second input ``key`` ``[n]`` (int64 or string), each row's key; a key
    without lines gets the global model's (409 if its keys' lines exceed one ONNX file)."""
    if model.split_by is not None:
        lines = replace(
            prediction.StoredLines.of_model(model),
            split_by=model.split_by,
            keyed=prediction.keyed_lines(model_store.load_keyed_arrays(session, model_id=model.id)),
        )
        content = exports.onnx_keyed_model(lines, dtype=dtype)
        return Response(
            content,
            media_type=exports.ONNX_MEDIA_TYPE,
            headers={"Content-Disposition": f'attachment; filename="model-{model.id}.onnx"'},
        )
    content = exports.onnx_model(prediction.StoredLines.of_model(model), dtype=dtype)
    return Response(
        content,
        media_type=exports.ONNX_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="model-{model.id}.onnx"'},
    )


@router.get(
    "/{name}/versions/{version}/export",
    responses={200: {"description": "the version's JSON document"}},
)
def export_version(model: ValidModelVersion, session: SessionDep) -> Response:
    """``GET /models/{model_id}/export`` of version ``version`` of ``name``."""
    return export(model, session)


@router.get(
    "/{name}/versions/{version}/model.onnx",
    response_class=Response,
    responses={
        200: {
            "description": "an ONNX graph: input X [n, d] (and key [n] of a keyed model), "
            "output predictions [n, k]"
        },
        409: {"description": "a keyed model's lines exceed what one ONNX file holds"},
    },
)
def onnx_version(
    model: ValidModelVersion,
    session: SessionDep,
    dtype: Annotated[
        exports.OnnxType, Query(description="the element type of X and of the predictions")
    ] = "float64",
) -> Response:
    """``GET /models/{model_id}/model.onnx`` of version ``version`` of ``name``."""
    return onnx(model, session, dtype)


@router.get("/{name}/versions/{version}", response_model=ModelOut)
def get_version(model: ValidModelVersion, session: SessionDep) -> ModelOut:
    """Version ``version`` of the registered model ``name``: as ``GET /models/{model_id}``."""
    return model_out(model, registry.version_of_model(session, model_id=model.id))


@router.delete(
    "/{model_id:model_segment}",
    status_code=204,
    response_class=Response,
    responses={409: {"description": "the model is a registered version an alias points at"}},
)
def delete(
    model_id: ModelId,
    cache: ModelCacheDep,
    session_factory: SessionFactoryDep,
    resolver: ReferenceResolverDep,
) -> None:
    """Delete a model; its job keeps the (now dangling) model id. A registered version that an
    alias points at is not deleted (409): move the alias first."""
    prediction.delete_model(
        cache=cache, session_factory=session_factory, reference=model_id, resolver=resolver
    )


@router.get(
    "/{model_id}/keys/{key}",
    response_model=KeyLines,
    responses={404: {"description": "no such model, or the model has no such key"}},
)
async def get_key(
    model_id: ModelId,
    key: Annotated[str, Path(description="a key (an integer key in decimal)", max_length=256)],
    request: Request,
) -> KeyLines:
    """One key's lines of a keyed model (fitted with ``split_by``), its rows and min-loss."""
    return prediction.key_lines(await lines_of(request, model_id), key)


@router.post(
    "/{model_id}/predict",
    response_model=PredictResponse,
    response_model_exclude_none=True,
    responses=PREDICT_RESPONSES,
    openapi_extra=predict_body(ModelPredictRequest),
)
async def predict(model_id: ModelId, request: Request) -> Response:
    """k predictions per row; with ``y`` also the min-loss and each row's best component. The
    body is JSON or an ``.npy`` array of rows; ``Accept: application/x-npy`` answers in
    ``.npy``."""
    return await serve_predict(request, path_model_id=model_id)


@router.post(
    "/{name}/versions/{version}/predict",
    response_model=PredictResponse,
    response_model_exclude_none=True,
    responses=PREDICT_RESPONSES,
    openapi_extra=predict_body(ModelPredictRequest),
)
async def predict_version(
    name: RegisteredName, version: VersionNumber, request: Request
) -> Response:
    """``POST /models/{model_id}/predict`` with version ``version`` of ``name``."""
    return await serve_predict(request, path_model_id=f"{name}/versions/{version}")
