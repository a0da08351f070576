"""The problem+json document (RFC 9457) every error of the service is answered with."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:mixreg:problem:"


def problem_response(
    *,
    status: int,
    detail: str,
    instance: str,
    slug: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Build an ``application/problem+json`` response."""
    body: dict[str, Any] = {
        "type": f"{TYPE_PREFIX}{slug}" if slug else "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)
