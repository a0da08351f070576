"""Predict with a model named in the body."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ModelCacheDep, SessionFactoryDep
from service.api.schemas import PredictRequest, PredictResponse
from service.serving import prediction

router = APIRouter(prefix="/predict", tags=["predict"])


@router.post("", response_model=PredictResponse, response_model_exclude_none=True)
def predict(
    body: PredictRequest, cache: ModelCacheDep, session_factory: SessionFactoryDep
) -> PredictResponse:
    """k predictions per row of ``X``; with ``y`` also the min-loss and each row's best line."""
    lines = prediction.load_lines(
        cache=cache, session_factory=session_factory, model_id=body.model_id
    )
    return prediction.predict(lines, body.X, body.y)
