"""Request and response bodies of the prediction log's settings and of outcomes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from service.schemas import FiniteFloat

SampleRate = Annotated[
    float,
    Field(ge=0, le=1, allow_inf_nan=False, description="the share of predict requests logged"),
]


class SampleRateIn(BaseModel):
    """The share of a model's (or alias's) predict requests that are logged."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"sample_rate": 1}]})

    sample_rate: SampleRate


class LogSettingOut(BaseModel):
    """One target's sampling rate: a model id, or ``name@alias``."""

    target: str
    sample_rate: float
    updated_at: datetime
    updated_by: str | None = Field(description="the API key that set it")


class LogSettingsOut(BaseModel):
    """The default sampling rate and every target's own."""

    default_sample_rate: float = Field(description="MIXREG_PREDICTION_LOG_SAMPLE_RATE")
    targets: list[LogSettingOut]


RequestId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[\x21-\x7e]+$",
        description="the X-Request-ID header of the predict answer",
    ),
]


class OutcomeIn(BaseModel):
    """The realised target of one predicted row."""

    model_config = ConfigDict(extra="forbid")

    request_id: RequestId
    row: int = Field(default=0, ge=0, description="the row of the predict request, from 0")
    y: FiniteFloat = Field(description="the realised value")


class OutcomesIn(BaseModel):
    """Realised targets of logged predictions; all are stored, or none."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"outcomes": [{"request_id": "5f0c2d9e1b7a4c3e", "row": 0, "y": 4.0}]}]
        },
    )

    outcomes: list[OutcomeIn] = Field(min_length=1)


class OutcomesOut(BaseModel):
    """How many outcomes were stored."""

    stored: int


class OutcomeWindowOut(BaseModel):
    """The outcome metrics of the predictions made in one window."""

    start: datetime
    end: datetime
    count: int = Field(description="outcomes of predictions made in the window")
    min_loss: float = Field(description="mean over outcomes of min_j (y - prediction_j)^2")
    coverage: float = Field(description="share of outcomes whose best entry is within tolerance")
    best_line_share: list[float] = Field(
        description="per line j, the share of outcomes that line j predicted best"
    )
    most_likely_loss: float | None = Field(
        description="gated models: mean squared error of the most likely line's prediction"
    )


class OutcomeMetricsOut(BaseModel):
    """Outcome metrics per window of the predictions of one model, version, alias or key."""

    model: str
    key: str | None
    window: str
    tolerance: float
    windows: list[OutcomeWindowOut]
