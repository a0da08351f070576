"""Opaque page cursors: the sort key of the last item a page showed, so the next page starts
right after it, whatever rows were added meanwhile (keyset pagination)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from service.errors import InvalidInputError


def encode(*key: Any) -> str:
    """A cursor holding ``key`` (JSON values)."""
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


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
            isinstance(value, kind) and not isinstance(value, bool)
            for value, kind in zip(key, types, strict=True)
        )
    ):
        raise InvalidInputError(
            f"cursor '{cursor[:100]}' is not a cursor of this list; pass the next_cursor of "
            f"the previous page unchanged"
        )
    return tuple(key)
