"""Opaque page cursors: the sort key of the last item a page showed, so the next page starts
right after it, whatever rows were added meanwhile (keyset pagination)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

from fastapi import Query

from service.errors import InvalidInputError


def encode(*key: Any) -> str:
    """A cursor holding ``key`` (JSON values)."""
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_INT64 = 2**63
"""Integer keys (versions, event ids) are 64-bit columns: a larger one can name no row, and
the database driver raises rather than compare it."""


def _not_a_cursor(cursor: str) -> InvalidInputError:
    return InvalidInputError(
        f"cursor '{cursor[:100]}' is not a cursor of this list; pass the next_cursor of "
        f"the previous page unchanged"
    )


def decode(cursor: str, *, types: tuple[type, ...]) -> tuple[Any, ...]:
    """The key a cursor of :func:`encode` holds, checked against ``types``; 422 if the cursor
    was not made by this service for this list."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        key = None
    if (
        not isinstance(key, list)
        or len(key) != len(types)
        or not all(
            isinstance(value, kind)
            and not isinstance(value, bool)
            and (not isinstance(value, int) or -_INT64 <= value < _INT64)
            for value, kind in zip(key, types, strict=True)
        )
    ):
        raise _not_a_cursor(cursor)
    return tuple(key)


CursorQuery = Annotated[
    str | None,
    Query(
        max_length=512,
        description="next_cursor of the previous page: the page starts right after its last "
        "item, so items added meanwhile never make a page skip or repeat one",
    ),
]


class _Row(Protocol):
    @property
    def created_at(self) -> datetime: ...

    @property
    def id(self) -> str: ...


def page_key(cursor: str | None, *, offset: int) -> tuple[datetime, str] | None:
    """The ``(created_at, id)`` after which a newest-first page starts; 422 for a cursor
    that is not one, or one given with an offset."""
    if cursor is None:
        return None
    if offset:
        raise InvalidInputError("give cursor or offset, not both; a cursor already says where")
    created_at, row_id = decode(cursor, types=(str, str))
    try:
        when: datetime | None = datetime.fromisoformat(created_at)
        if when is not None and when.tzinfo is not None:
            # In UTC, as the column stores it: an instant at the edge of the calendar (year 1
            # or 9999 with an offset) has no UTC value and overflows here, not in the store.
            when = when.astimezone(UTC)
    except (ValueError, OverflowError):
        when = None
    if when is None or when.tzinfo is None:
        raise _not_a_cursor(cursor)
    return when, row_id


def next_page(rows: Sequence[_Row], limit: int) -> tuple[list[Any], str | None]:
    """The first ``limit`` of ``rows`` (read with ``limit + 1``), and the cursor of the next
    page, None if this is the last."""
    page = list(rows[:limit])
    if len(rows) <= limit:
        return page, None
    last = page[-1]
    return page, encode(last.created_at.isoformat(), last.id)
