"""Fitted models: list, inspect, delete, predict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from models_store import repository
from service.api.deps import (
    ModelCacheDep,
    SessionDep,
    SessionFactoryDep,
    ValidModel,
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

ModelId = Annotated[str, Path(description="id of a fitted model")]


@router.get("", response_model=Page[ModelSummary])
def list_(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[ModelSummary]:
    """Fitted models, newest first."""
    models, total = repository.list_models(session, limit=limit, offset=offset)
    return Page[ModelSummary](
        items=[model_summary(model) for model in models], total=total, limit=limit, offset=offset
    )


@router.get("/{model_id}", response_model=ModelOut)
def get(model: ValidModel) -> ModelOut:
    """The θ list (coefficients and intercept per component), scores, baseline, provenance."""
    return model_out(model)


@router.delete("/{model_id}", status_code=204, response_class=Response)
def delete(model_id: ModelId, cache: ModelCacheDep, session_factory: SessionFactoryDep) -> None:
    """Delete a model; its job keeps the (now dangling) model id."""
    prediction.delete_model(cache=cache, session_factory=session_factory, model_id=model_id)


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
