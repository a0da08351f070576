"""Realised outcomes joined to logged predictions, and the metrics they give.

A prediction is a list of k values judged by its best entry, so an outcome ``y`` of a logged
row gives its min-loss ``min_j (y - prediction_j)^2`` and the line reaching it; of a gated
model also the squared error of the line the gate found most likely. Metrics are sums over
the outcomes of the predictions made in a window (hours or days of the prediction's time),
so a window's min-loss is exactly the mean min-loss of its rows computed offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models_store import prediction_log
from models_store.prediction_log import OutcomeFilter, WindowSums
from models_store.session import read_scope
from models_store.tables import PredictionOutcome
from service.data.model_references import parse_reference
from service.errors import InvalidInputError

WINDOW_HOURS = {"hour": 1, "day": 24}
"""The windows metrics are given over, in hours."""


@dataclass(frozen=True)
class RealisedValue:
    """The realised target ``y`` of row ``row`` of the predict request ``request_id``."""

    request_id: str
    row: int
    y: float


def hour_of(moment: datetime) -> int:
    """Whole hours since the Unix epoch at ``moment``."""
    return int(moment.timestamp() // 3600)


def record_outcomes(session: Session, values: Sequence[RealisedValue], *, now: datetime) -> int:
    """Join ``values`` to their logged predictions and store them with their errors; all or
    none. A 422 names the first value that has no logged prediction, names a row the request
    did not predict, repeats one of this body or has an outcome already."""
    seen: dict[tuple[str, int], int] = {}
    for position, value in enumerate(values):
        pair = (value.request_id, value.row)
        if pair in seen:
            raise InvalidInputError(
                f"outcomes[{position}]: request_id '{value.request_id}' row {value.row} is "
                f"given twice in this body (also at outcomes[{seen[pair]}])"
            )
        seen[pair] = position
    request_ids = {value.request_id for value in values}
    logged = prediction_log.logged_rows(session, request_ids=request_ids)
    rows_of: dict[str, int] = {}
    for request_id, row in logged:
        rows_of[request_id] = max(rows_of.get(request_id, 0), row + 1)
    already = prediction_log.stored_outcomes(session, request_ids=request_ids)
    outcomes = []
    for position, value in enumerate(values):
        pair = (value.request_id, value.row)
        prediction = logged.get(pair)
        if prediction is None:
            raise InvalidInputError(_not_logged(position, value, rows_of.get(value.request_id)))
        if pair in already:
            raise InvalidInputError(
                f"outcomes[{position}]: the outcome of request_id '{value.request_id}' row "
                f"{value.row} was already posted; an outcome is stored once"
            )
        predictions = np.frombuffer(prediction.predictions, dtype="<f8")
        with np.errstate(over="ignore"):
            squared_errors = (value.y - predictions) ** 2
        best = int(np.argmin(squared_errors))
        if not np.isfinite(squared_errors[best]):
            raise InvalidInputError(
                f"outcomes[{position}].y: its squared error overflows a float64"
            )
        most_likely = prediction.most_likely_component
        outcomes.append(
            PredictionOutcome(
                request_id=value.request_id,
                row_index=value.row,
                model_id=prediction.model_id,
                registered_model=prediction.registered_model,
                version=prediction.version,
                alias=prediction.alias,
                key=prediction.key,
                predicted_at=prediction.logged_at,
                predicted_hour=hour_of(prediction.logged_at),
                observed_at=now,
                y=value.y,
                min_loss=float(squared_errors[best]),
                best_component=best,
                n_components=len(predictions),
                most_likely_loss=None
                if most_likely is None
                else float(squared_errors[most_likely]),
            )
        )
    try:
        prediction_log.add_outcomes(session, outcomes)
    except IntegrityError:  # another request stored one of them meanwhile
        raise InvalidInputError(
            "outcomes: one of them was posted meanwhile by another request; an outcome is "
            "stored once (none of these was stored)"
        ) from None
    return len(outcomes)


def _not_logged(position: int, value: RealisedValue, n_rows: int | None) -> str:
    if n_rows is not None:
        return (
            f"outcomes[{position}].row: request_id '{value.request_id}' predicted rows 0 to "
            f"{n_rows - 1}; row {value.row} was never predicted"
        )
    return (
        f"outcomes[{position}].request_id: '{value.request_id}' has no logged prediction (the "
        f"request was not sampled, is older than MIXREG_PREDICTION_LOG_RETENTION_DAYS, or is "
        f"not written yet: the log is written every MIXREG_PREDICTION_LOG_FLUSH_INTERVAL_S)"
    )


def filter_of(reference: str, key: str | None) -> OutcomeFilter:
    """The outcomes a reference selects: a model id's, ``name@alias``'s (predicted through
    the alias, whatever version answered), ``name/versions/N``'s or all of ``name``'s."""
    parsed = parse_reference(reference)
    return OutcomeFilter(
        model_id=parsed.model_id,
        registered_model=parsed.name,
        version=parsed.version,
        alias=parsed.alias,
        key=key,
    )


def window_metrics(sums: WindowSums, *, window_hours: int) -> dict[str, Any]:
    """One window's metrics (the fields of ``OutcomeWindowOut``) from its sums."""
    start = datetime.fromtimestamp(sums.window * 3600, tz=UTC)
    shares = [0.0] * sums.n_components
    for component, count in sums.best_component_counts.items():
        shares[component] = count / sums.count
    return {
        "start": start,
        "end": start + timedelta(hours=window_hours),
        "count": sums.count,
        "min_loss": sums.sum_min_loss / sums.count,
        "coverage": sums.covered / sums.count,
        "best_line_share": shares,
        "most_likely_loss": sums.sum_most_likely_loss / sums.gated_count
        if sums.gated_count
        else None,
    }


def outcome_metrics(
    session: Session,
    *,
    where: OutcomeFilter,
    window: str,
    since: datetime,
    until: datetime,
    tolerance: float,
) -> list[dict[str, Any]]:
    """The metrics per window of the outcomes ``where`` selects, of predictions made in the
    windows from the one holding ``since`` to the one holding ``until``."""
    window_hours = WINDOW_HOURS[window]
    windows = prediction_log.outcome_windows(
        session,
        where=where,
        window_hours=window_hours,
        from_hour=hour_of(since) // window_hours * window_hours,
        to_hour=(hour_of(until) // window_hours + 1) * window_hours,
        tolerance=tolerance,
    )
    return [window_metrics(sums, window_hours=window_hours) for sums in windows]


RECENT_HOURS = 24
"""``/metrics`` reports the outcomes of the predictions of the last this many hours."""

MAX_EXPORTED_MODELS = 200
"""``/metrics`` reports at most this many (model, alias) series, those with most outcomes."""


def recent_outcomes(
    session_factory: sessionmaker[Session], *, tolerance: float
) -> list[dict[str, Any]]:
    """Per model version and alias, the count, min-loss and coverage of the outcomes of the
    predictions of the last ``RECENT_HOURS`` hours (what ``/metrics`` exports)."""
    since = hour_of(datetime.now(UTC)) - RECENT_HOURS + 1
    with read_scope(session_factory) as session:
        groups = prediction_log.recent_outcomes_by_model(
            session, from_hour=since, tolerance=tolerance, limit=MAX_EXPORTED_MODELS
        )
    return [
        {
            "model_id": group.model_id,
            "registered_model": group.registered_model or "",
            "version": "" if group.version is None else str(group.version),
            "alias": group.alias or "",
            "count": group.count,
            "min_loss": group.sum_min_loss / group.count,
            "coverage": group.covered / group.count,
        }
        for group in groups
    ]
