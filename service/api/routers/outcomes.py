"""The prediction log's sampling rates, realised outcomes, and the metrics they give.

Setting a rate and posting outcomes need a ``write`` key; reading them, a ``read`` key.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query, Request, Response

from models_store import prediction_log
from models_store.tables import PredictionLogSetting
from service.api.deps import SessionDep, SettingsDep
from service.api.docs import EXAMPLE_REQUEST_ID
from service.auth.middleware import ApiKeyDep
from service.data import model_references
from service.errors import InvalidInputError, LimitExceededError, NotFoundError
from service.schemas_outcomes import (
    LogSettingOut,
    LogSettingsOut,
    OutcomeMetricsOut,
    OutcomesIn,
    OutcomesOut,
    OutcomeWindowOut,
    SampleRateIn,
)
from service.serving import outcomes
from service.serving.prediction_log import PredictionLogger

router = APIRouter(tags=["outcomes"])

Target = Annotated[
    str,
    Path(
        max_length=257,
        description="a model id, or name@alias (the rate of predictions made through it)",
    ),
]


def _logger(request: Request) -> PredictionLogger:
    logger: PredictionLogger = request.app.state.prediction_log
    return logger


def _setting_out(setting: PredictionLogSetting) -> LogSettingOut:
    return LogSettingOut(
        target=setting.target,
        sample_rate=setting.sample_rate,
        updated_at=setting.updated_at,
        updated_by=setting.updated_by,
    )


@router.get("/prediction-log/settings", response_model=LogSettingsOut)
def get_settings(session: SessionDep, settings: SettingsDep) -> LogSettingsOut:
    """The default sampling rate and every model's or alias's own."""
    return LogSettingsOut(
        default_sample_rate=settings.prediction_log_sample_rate,
        targets=[_setting_out(setting) for setting in prediction_log.list_settings(session)],
    )


@router.put(
    "/prediction-log/settings/{target}",
    response_model=LogSettingOut,
    responses={404: {"description": "no such model or alias"}},
)
def put_setting(
    target: Target,
    body: Annotated[
        SampleRateIn,
        Body(
            openapi_examples={
                "every-request": {
                    "summary": "log every predict request of the model or alias",
                    "value": {"sample_rate": 1},
                }
            }
        ),
    ],
    request: Request,
    session: SessionDep,
    api_key: ApiKeyDep,
) -> LogSettingOut:
    """Log this share of the predict requests that name ``target`` (``name@alias``) or are
    answered by it (a model id); 0 logs none. Every process follows within
    ``MIXREG_ALIAS_REFRESH_S``."""
    parsed = model_references.parse_reference(target)
    if parsed.model_id is None and parsed.alias is None:
        raise InvalidInputError(
            f"target '{target[:140]}': give a model id or name@alias; a rate follows the "
            f"reference a request names, or the model that answers it"
        )
    model_references.get_model(session, target)  # 404 naming what does not exist
    setting = prediction_log.put_setting(
        session,
        target=target,
        sample_rate=body.sample_rate,
        now=datetime.now(UTC),
        updated_by=None if api_key is None else api_key.id,
    )
    _logger(request).set_rate_after_commit(session, target, body.sample_rate)
    return _setting_out(setting)


@router.delete(
    "/prediction-log/settings/{target}",
    status_code=204,
    responses={404: {"description": "the target has no rate of its own"}},
)
def delete_setting(target: Target, request: Request, session: SessionDep) -> Response:
    """Forget ``target``'s rate: it takes the default (``MIXREG_PREDICTION_LOG_SAMPLE_RATE``)."""
    if not prediction_log.delete_setting(session, target=target):
        raise NotFoundError(f"'{target[:140]}' has no sampling rate of its own")
    _logger(request).set_rate_after_commit(session, target, None)
    return Response(status_code=204)


@router.post(
    "/outcomes",
    status_code=201,
    response_model=OutcomesOut,
    responses={
        422: {
            "description": "an unknown request id, a row never predicted, a value that is not "
            "a finite number, an outcome posted before, or more outcomes than "
            "MIXREG_MAX_OUTCOMES_PER_REQUEST: none is stored"
        },
    },
)
def post_outcomes(
    body: Annotated[
        OutcomesIn,
        Body(
            openapi_examples={
                "one-outcome": {
                    "summary": "the realised target of row 0 of a logged predict request",
                    "value": {"outcomes": [{"request_id": EXAMPLE_REQUEST_ID, "row": 0, "y": 4.0}]},
                }
            }
        ),
    ],
    session: SessionDep,
    settings: SettingsDep,
) -> OutcomesOut:
    """Realised targets of logged predictions, by the ``X-Request-ID`` of the predict answer
    and the row (from 0) of its request; all are stored, or none."""
    limit = settings.max_outcomes_per_request
    if len(body.outcomes) > limit:
        raise LimitExceededError(
            f"{len(body.outcomes):,} outcomes; a request may post at most {limit:,} "
            f"(MIXREG_MAX_OUTCOMES_PER_REQUEST)"
        )
    values = [
        outcomes.RealisedValue(request_id=item.request_id, row=item.row, y=item.y)
        for item in body.outcomes
    ]
    stored = outcomes.record_outcomes(session, values, now=datetime.now(UTC))
    return OutcomesOut(stored=stored)


@router.get(
    "/outcomes/metrics",
    response_model=OutcomeMetricsOut,
    responses={404: {"description": "model is not of the form of a model reference"}},
)
def get_metrics(
    session: SessionDep,
    settings: SettingsDep,
    model: Annotated[
        str,
        Query(
            max_length=300,
            description="a model id, name@alias (predictions made through the alias), "
            "name/versions/N, or a registered model's name (all its versions)",
        ),
    ],
    key: Annotated[
        str | None, Query(max_length=1024, description="a keyed model's key only")
    ] = None,
    window: Annotated[Literal["hour", "day"], Query(description="the window length")] = "hour",
    since: Annotated[
        datetime | None, Query(description="predictions made from (default: a day ago)")
    ] = None,
    until: Annotated[datetime | None, Query(description="up to (default: now)")] = None,
    tolerance: Annotated[
        float | None,
        Query(gt=0, allow_inf_nan=False, description="coverage: |y - best entry| at most this"),
    ] = None,
) -> OutcomeMetricsOut:
    """Per window of the predictions' time: the outcomes' count, mean min-loss, coverage,
    each line's share of best predictions and, for gated models, the most likely line's
    mean squared error. Windows without outcomes are left out."""
    now = datetime.now(UTC)
    until = _aware(until, "until") if until is not None else now
    since = _aware(since, "since") if since is not None else until - timedelta(days=1)
    if since >= until:
        raise InvalidInputError("since: must be before until")
    if (until - since) > timedelta(days=366):
        raise InvalidInputError("since: a request covers at most 366 days")
    tolerance = tolerance if tolerance is not None else settings.outcome_tolerance
    windows = outcomes.outcome_metrics(
        session,
        where=outcomes.filter_of(model, key),
        window=window,
        since=since,
        until=until,
        tolerance=tolerance,
    )
    return OutcomeMetricsOut(
        model=model,
        key=key,
        window=window,
        tolerance=tolerance,
        windows=[OutcomeWindowOut(**metrics) for metrics in windows],
    )


def _aware(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None:
        raise InvalidInputError(f"{name}: give a time zone (e.g. 2026-11-29T10:00:00Z)")
    return moment.astimezone(UTC)
