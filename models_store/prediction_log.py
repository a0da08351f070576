"""Every read and write of the prediction log, its sampling settings and realised outcomes.

Functions flush, never commit: the caller's unit of work commits. Windows of outcomes are
groups of ``predicted_hour`` (whole hours since the Unix epoch), an integer division that
reads the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from models_store.tables import LoggedPrediction, PredictionLogSetting, PredictionOutcome


def list_settings(session: Session) -> list[PredictionLogSetting]:
    """Every target's sampling setting, by target."""
    return list(session.scalars(select(PredictionLogSetting).order_by(PredictionLogSetting.target)))


def put_setting(
    session: Session, *, target: str, sample_rate: float, now: datetime, updated_by: str | None
) -> PredictionLogSetting:
    """Set the share of ``target``'s predictions that are logged (created or replaced)."""
    setting = session.get(PredictionLogSetting, target, with_for_update=True)
    if setting is None:
        setting = PredictionLogSetting(target=target)
        session.add(setting)
    setting.sample_rate = sample_rate
    setting.updated_at = now
    setting.updated_by = updated_by
    session.flush()
    return setting


def delete_setting(session: Session, *, target: str) -> bool:
    """Forget ``target``'s setting (it takes the default again); whether there was one."""
    result = session.execute(
        delete(PredictionLogSetting).where(PredictionLogSetting.target == target)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


LOGGED_COLUMNS = (
    "request_id",
    "row_index",
    "logged_at",
    "model_id",
    "registered_model",
    "version",
    "alias",
    "key",
    "features",
    "predictions",
    "most_likely_component",
)
"""The columns a logged row is written with, in the order of :func:`insert_logged_rows`'s
tuples."""


def insert_logged_rows(session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
    """Store logged rows (tuples of ``LOGGED_COLUMNS``); a (request id, row) already logged
    keeps its first row (a caller may repeat its own ``X-Request-ID``).

    One ``executemany`` of the driver, the time converted once per batch by the column's own
    type: SQLAlchemy's per-row parameter processing would cost as much as the write.
    """
    if not rows:
        return
    connection = session.connection()
    dialect = connection.dialect
    to_stored_time = LoggedPrediction.__table__.c.logged_at.type.dialect_impl(
        dialect
    ).bind_processor(dialect)
    at = LOGGED_COLUMNS.index("logged_at")
    converted: dict[Any, Any] = {}
    prepared = []
    for row in rows:
        moment = row[at]
        if moment not in converted:
            converted[moment] = moment if to_stored_time is None else to_stored_time(moment)
        prepared.append((*row[:at], converted[moment], *row[at + 1 :]))
    marker = "?" if dialect.paramstyle == "qmark" else "%s"
    connection.exec_driver_sql(
        f"INSERT INTO prediction_log ({', '.join(LOGGED_COLUMNS)}) "
        f"VALUES ({', '.join([marker] * len(LOGGED_COLUMNS))}) "
        f"ON CONFLICT (request_id, row_index) DO NOTHING",
        prepared,
    )


def logged_rows(
    session: Session, *, request_ids: Iterable[str]
) -> dict[tuple[str, int], LoggedPrediction]:
    """The logged rows of ``request_ids`` by (request id, row index)."""
    found = session.scalars(
        select(LoggedPrediction).where(LoggedPrediction.request_id.in_(set(request_ids)))
    )
    return {(row.request_id, row.row_index): row for row in found}


def stored_outcomes(session: Session, *, request_ids: Iterable[str]) -> set[tuple[str, int]]:
    """The (request id, row index) pairs of ``request_ids`` that already have an outcome."""
    pairs = session.execute(
        select(PredictionOutcome.request_id, PredictionOutcome.row_index).where(
            PredictionOutcome.request_id.in_(set(request_ids))
        )
    )
    return {(request_id, row_index) for request_id, row_index in pairs}


def add_outcomes(session: Session, outcomes: Sequence[PredictionOutcome]) -> None:
    """Store ``outcomes``; an IntegrityError if one was stored meanwhile (by another request)."""
    session.add_all(outcomes)
    session.flush()


@dataclass(frozen=True)
class OutcomeFilter:
    """Which outcomes a metric reads: all of a model id, or of a registered model (one version
    of it, or those predicted through one alias), optionally of one key only."""

    model_id: str | None = None
    registered_model: str | None = None
    version: int | None = None
    alias: str | None = None
    key: str | None = None

    def clauses(self) -> list[Any]:
        """The WHERE clauses of this filter."""
        columns = {
            PredictionOutcome.model_id: self.model_id,
            PredictionOutcome.registered_model: self.registered_model,
            PredictionOutcome.version: self.version,
            PredictionOutcome.alias: self.alias,
            PredictionOutcome.key: self.key,
        }
        return [column == value for column, value in columns.items() if value is not None]


@dataclass(frozen=True)
class WindowSums:
    """The sums over one window's outcomes that its metrics are ratios of."""

    window: int
    """The window's first hour since the Unix epoch."""
    count: int
    sum_min_loss: float
    covered: int
    gated_count: int
    sum_most_likely_loss: float
    best_component_counts: dict[int, int]
    n_components: int
    """The largest k among the window's models."""


def outcome_windows(
    session: Session,
    *,
    where: OutcomeFilter,
    window_hours: int,
    from_hour: int,
    to_hour: int,
    tolerance: float,
) -> list[WindowSums]:
    """The sums of the outcomes ``where`` selects predicted in hours ``[from_hour, to_hour)``,
    per window of ``window_hours`` hours (windows without outcomes are left out); an outcome
    is covered when its best entry is within ``tolerance`` of ``y``."""
    window = (PredictionOutcome.predicted_hour // window_hours).label("window")
    clauses = [
        *where.clauses(),
        PredictionOutcome.predicted_hour >= from_hour,
        PredictionOutcome.predicted_hour < to_hour,
    ]
    sums = session.execute(
        select(
            window,
            func.count(),
            func.sum(PredictionOutcome.min_loss),
            func.sum(case((PredictionOutcome.min_loss <= tolerance * tolerance, 1), else_=0)),
            func.count(PredictionOutcome.most_likely_loss),
            func.coalesce(func.sum(PredictionOutcome.most_likely_loss), 0.0),
            func.max(PredictionOutcome.n_components),
        )
        .where(*clauses)
        .group_by(window)
        .order_by(window)
    ).all()
    shares: dict[int, dict[int, int]] = {}
    for at, component, count in session.execute(
        select(window, PredictionOutcome.best_component, func.count())
        .where(*clauses)
        .group_by(window, PredictionOutcome.best_component)
    ):
        shares.setdefault(int(at), {})[int(component)] = int(count)
    return [
        WindowSums(
            window=int(at) * window_hours,
            count=int(count),
            sum_min_loss=float(sum_min_loss),
            covered=int(covered),
            gated_count=int(gated_count),
            sum_most_likely_loss=float(sum_most_likely),
            best_component_counts=shares.get(int(at), {}),
            n_components=int(n_components),
        )
        for at, count, sum_min_loss, covered, gated_count, sum_most_likely, n_components in sums
    ]


@dataclass(frozen=True)
class ModelSums:
    """The sums over one model version's outcomes (through one alias, or none) since an hour."""

    model_id: str
    registered_model: str | None
    version: int | None
    alias: str | None
    count: int
    sum_min_loss: float
    covered: int


def recent_outcomes_by_model(
    session: Session, *, from_hour: int, tolerance: float, limit: int
) -> list[ModelSums]:
    """Per model and alias, the sums of the outcomes predicted since ``from_hour`` (at most
    ``limit`` groups, those with the most outcomes): what ``/metrics`` exports."""
    group = (
        PredictionOutcome.model_id,
        PredictionOutcome.registered_model,
        PredictionOutcome.version,
        PredictionOutcome.alias,
    )
    rows = session.execute(
        select(
            *group,
            func.count(),
            func.sum(PredictionOutcome.min_loss),
            func.sum(case((PredictionOutcome.min_loss <= tolerance * tolerance, 1), else_=0)),
        )
        .where(PredictionOutcome.predicted_hour >= from_hour)
        .group_by(*group)
        .order_by(func.count().desc())
        .limit(limit)
    )
    return [
        ModelSums(
            model_id=model_id,
            registered_model=registered_model,
            version=version,
            alias=alias,
            count=int(count),
            sum_min_loss=float(sum_min_loss),
            covered=int(covered),
        )
        for model_id, registered_model, version, alias, count, sum_min_loss, covered in rows
    ]


def delete_logged_before(session: Session, *, before: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the oldest logged rows logged before ``before``; how many.

    One bounded batch: the caller commits it before the next, so that on SQLite the write lock
    is held for one batch at a time, never for the whole clean-up.
    """
    oldest = (
        select(LoggedPrediction.id)
        .where(LoggedPrediction.logged_at < before)
        .order_by(LoggedPrediction.logged_at, LoggedPrediction.id)
        .limit(limit)
    )
    result = session.execute(
        delete(LoggedPrediction).where(LoggedPrediction.id.in_(oldest.scalar_subquery()))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def delete_outcomes_before(session: Session, *, before: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the oldest outcomes observed before ``before``; how many
    (one bounded batch, as :func:`delete_logged_before`)."""
    oldest = (
        select(PredictionOutcome.id)
        .where(PredictionOutcome.observed_at < before)
        .order_by(PredictionOutcome.observed_at, PredictionOutcome.id)
        .limit(limit)
    )
    result = session.execute(
        delete(PredictionOutcome).where(PredictionOutcome.id.in_(oldest.scalar_subquery()))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
