"""Predict with a model named in the body (or, for an ``.npy`` body, in ``?model_id=``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from service.schemas import ModelPredictRequest, PredictRequest, PredictResponse
from service.serving import formats
from service.serving.endpoint import NPY_OUTPUTS, serve_predict

router = APIRouter(prefix="/predict", tags=["predict"])

NPY_BODY = {
    "schema": {"type": "string", "format": "binary"},
    "description": "an .npy array of shape (n, d): n rows of the model's d features (any "
    "numeric dtype)",
}


NPZ_BODY = {
    "schema": {"type": "string", "format": "binary"},
    "description": "for a keyed model: an .npz archive of the arrays X (n, d) of numbers and "
    "keys (n,) of integers or text, one key per row",
}


def predict_body(schema: type[PredictRequest] | type[ModelPredictRequest]) -> dict[str, Any]:
    """The OpenAPI request body of a predict route: JSON, or an ``.npy`` array; and the
    ``output`` query parameter of an ``.npy`` answer (read from the request directly: the hot
    path resolves no parameters)."""
    return {
        "parameters": [
            {
                "name": "output",
                "in": "query",
                "required": False,
                "description": "what an .npy answer holds: the predictions, or for a gated "
                "model one of its probabilities, expected values, most likely values or lines",
                "schema": {"type": "string", "enum": list(NPY_OUTPUTS), "default": "predictions"},
            },
            {
                "name": "unknown_keys",
                "in": "query",
                "required": False,
                "description": "an .npz body's keys the keyed model does not know: predicted by "
                "its global model, or a 422 naming the first (a JSON body says it in its field)",
                "schema": {"type": "string", "enum": ["global", "error"], "default": "global"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                formats.JSON_MEDIA_TYPE: {"schema": schema.model_json_schema()},
                formats.NPY_MEDIA_TYPE: NPY_BODY,
                formats.NPZ_MEDIA_TYPE: NPZ_BODY,
            },
        },
    }


PREDICT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "k predictions per row: JSON, or with `Accept: application/x-npy` an "
        ".npy float64 array of shape (n, k)",
        "content": {formats.NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    },
    404: {"description": "the model does not exist"},
    406: {"description": "an .npy answer was asked for a request with y"},
    413: {
        "description": "a JSON body over MIXREG_MAX_PREDICT_JSON_BYTES, .npz arrays that "
        "decompress to more than MIXREG_MAX_BODY_BYTES, or an answer of more than "
        "MIXREG_MAX_PREDICT_VALUES values"
    },
    415: {"description": "the body is neither JSON, application/x-npy nor application/x-npz"},
}


@router.post(
    "",
    response_model=PredictResponse,
    response_model_exclude_none=True,
    responses=PREDICT_RESPONSES,
    openapi_extra=predict_body(PredictRequest),
)
async def predict(
    request: Request,
    model_id: Annotated[
        str | None,
        Query(description="the model, for an .npy body (a JSON body names it in model_id)"),
    ] = None,
) -> Response:
    """k predictions per row of ``X``; with ``y`` also the min-loss and each row's best line.

    The body is JSON, or an ``.npy`` array of rows (``Content-Type: application/x-npy``) with
    the model in ``?model_id=``; ``Accept: application/x-npy`` answers in ``.npy``.
    """
    return await serve_predict(request, query_model_id=model_id)
