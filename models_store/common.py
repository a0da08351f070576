"""What every module of the store shares: ids, the clock, counted bulk writes, newest-first
pages, and the join of a keyed model's chunks (or a keyed job's shards).

Like every module of the store, its functions take the session first and everything else by
keyword. They flush so that generated values and constraint errors surface at once, but never
commit: the caller's unit of work (``session_scope``) decides.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    CursorResult,
    Select,
    func,
    select,
    text,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Delete, Update

from models_store.codecs import (
    decode_arrays,
    encode_arrays,
)
from models_store.tables import (
    IDEMPOTENCY_SCOPE_WITHOUT_KEY,
    Dataset,
    Job,
    Model,
)

_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


def new_id() -> str:
    """A new id of the form of the generated ones (a uuid4 in hex)."""
    return uuid.uuid4().hex


def is_id(value: str) -> bool:
    """True if ``value`` has the form of a generated id; others name nothing and are never
    sent to the database (PostgreSQL refuses NUL characters in text, for one)."""
    return _ID_PATTERN.fullmatch(value) is not None


def idempotency_scope(api_key_id: str | None) -> str:
    """The scope within which a caller's Idempotency-Keys are unique: its API key."""
    return api_key_id if api_key_id is not None else IDEMPOTENCY_SCOPE_WITHOUT_KEY


def utcnow() -> datetime:
    """Now, in UTC: the time every row of the store records (one clock for all of them)."""
    return datetime.now(UTC)


def execute_counting(session: Session, statement: Update | Delete) -> int:
    """Run the bulk ``statement``; return how many rows it changed."""
    # Bulk statements leave the identity map alone; callers expire what they changed.
    result = session.execute(statement, execution_options={"synchronize_session": False})
    return cast(CursorResult[Any], result).rowcount


def check_page(limit: int, offset: int) -> None:
    """Raise ``ValueError`` unless ``limit`` and ``offset`` are non-negative."""
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be non-negative, got {limit} and {offset}")


def count_rows(session: Session, query: Select[Any]) -> int:
    """How many rows ``query`` selects."""
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


PageKey = tuple[datetime, str]
"""Where a page of a newest-first list ends: the ``(created_at, id)`` of its last row."""


def newest_first(
    session: Session,
    query: Select[Any],
    table: type[Dataset] | type[Job] | type[Model],
    *,
    limit: int,
    offset: int,
    after: PageKey | None,
) -> tuple[list[Any], int]:
    """A page of ``query`` newest first, and the total count of ``query``.

    ``after`` (keyset pagination) starts the page right after the row with that key: rows
    added meanwhile are newer and come before it, so paging neither skips nor repeats a row,
    which an ``offset`` does when rows arrive.
    """
    check_page(limit, offset)
    total = count_rows(session, query)
    if after is not None:
        created_at, row_id = after
        query = query.where(
            (table.created_at < created_at)
            | ((table.created_at == created_at) & (table.id < row_id))
        )
    page = session.scalars(
        query.order_by(table.created_at.desc(), table.id.desc()).limit(limit).offset(offset)
    )
    return list(page), total


UNFINISHED_JOB_STATUSES = ("queued", "running")
"""The statuses of a job that may still change."""

FloatArray = npt.NDArray[np.float64]


def database_now(session: Session) -> datetime:
    """The time by the database's clock (PostgreSQL: the server's; SQLite, a local file: this
    machine's), so that workers on several machines judge heartbeats by one clock."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(text("SELECT statement_timestamp()"))
        assert isinstance(now, datetime)
        return now.astimezone(UTC)
    return utcnow()


def _compact_text(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Fixed-width text (keys stored before texts were stored as UTF-8) as Python strings:
    joined with other chunks, or kept in a cache, it is not padded to its longest key."""
    return array.astype(object) if array.dtype.kind == "U" else array


def encode_keyed_chunk(arrays: Mapping[str, npt.ArrayLike]) -> bytes:
    """The stored bytes of consecutive keys and their lines (``KeyedModelChunk.data``); text
    keys (fixed-width or an object array of ``str``) are stored as UTF-8 bytes and offsets."""
    return encode_arrays(arrays)


def join_keyed_chunks(session: Session, query: Select[Any]) -> dict[str, npt.NDArray[Any]]:
    """The chunks of keys ``query`` selects (the ``data`` of a keyed model's chunks or of a
    keyed job's shards, in key order) joined: name -> array. Read one row at a time."""
    parts: dict[str, list[npt.NDArray[Any]]] = {}
    for data in session.scalars(query, execution_options={"yield_per": 1}):
        for name, array in decode_arrays(bytes(data)).items():
            parts.setdefault(name, []).append(_compact_text(array))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}
