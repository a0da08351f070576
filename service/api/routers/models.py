"""Fitted models: list, inspect, delete, predict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from models_store import registry, repository
from service.api import cursors
from service.api.deps import (
    MODEL_REFERENCE,
    ModelCacheDep,
    SessionDep,
    SessionFactoryDep,
    ValidModel,
    ValidModelVersion,
)
from service.api.routers.predict import PREDICT_RESPONSES, predict_body
from service.schemas import (
    MAX_OFFSET,
    ModelOut,
    ModelPredictRequest,
    ModelSummary,
    Page,
    PredictResponse,
)
from service.serving import prediction
from service.serving.endpoint import serve_predict
from service.views import model_out, model_summary

router = APIRouter(prefix="/models", tags=["models"])

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
    rows, total = repository.list_models(session, limit=limit + 1, offset=offset, after=after)
    models, next_cursor = cursors.next_page(rows, limit)
    versions = registry.versions_of_models(session, model_ids=[model.id for model in models])
    return Page[ModelSummary](
        items=[model_summary(model, versions.get(model.id)) for model in models],
        total=total,
        limit=limit,
        offset=offset,
        next_cursor=next_cursor,
    )


@router.get("/{model_id}", response_model=ModelOut)
def get(model: ValidModel, session: SessionDep) -> ModelOut:
    """The θ list (coefficients and intercept per component), scores, baseline, provenance.

    The model is named by its id, ``name@alias``, or a registered model's name (its latest
    version)."""
    return model_out(model, registry.version_of_model(session, model_id=model.id))


@router.get("/{name}/versions/{version}", response_model=ModelOut)
def get_version(model: ValidModelVersion, session: SessionDep) -> ModelOut:
    """Version ``version`` of the registered model ``name``: as ``GET /models/{model_id}``."""
    return model_out(model, registry.version_of_model(session, model_id=model.id))


@router.delete("/{model_id}", status_code=204, response_class=Response)
def delete(model_id: ModelId, cache: ModelCacheDep, session_factory: SessionFactoryDep) -> None:
    """Delete a model; its job keeps the (now dangling) model id. A registered version that an
    alias points at is not deleted (409): move the alias first."""
    prediction.delete_model(cache=cache, session_factory=session_factory, reference=model_id)


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
