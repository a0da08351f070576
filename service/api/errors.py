"""RFC 9457 problem details: the one error shape of every endpoint."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:mixreg:problem:"

logger = logging.getLogger(__name__)


class ProblemError(Exception):
    """An error that becomes a problem+json response with a precise ``detail``."""

    status: int = 400
    slug: str = "bad-request"

    def __init__(self, detail: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors


class InvalidInputError(ProblemError):
    """The request is well-formed but its content cannot be used (422)."""

    status = 422
    slug = "invalid-input"


class NotFoundError(ProblemError):
    """A referenced dataset, job or model does not exist (404)."""

    status = 404
    slug = "not-found"


class ConflictError(ProblemError):
    """The request conflicts with the current state of a resource (409)."""

    status = 409
    slug = "conflict"


class UnsupportedMediaTypeError(ProblemError):
    """The request body has a content type the endpoint cannot read (415)."""

    status = 415
    slug = "unsupported-media-type"


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


def format_location(loc: Sequence[int | str]) -> str:
    """Render a pydantic error location as ``data.X[3][1]``, without the leading ``body``."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _describe_validation_error(error: dict[str, Any]) -> str:
    """One sentence for one pydantic error; custom errors already name their field."""
    if error["type"] in CUSTOM_ERROR_TYPES:
        return str(error["msg"])
    location = format_location(error["loc"])
    if error["type"] == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        position = error["loc"][1] if len(error["loc"]) > 1 else None
        where = f" at character {position}" if isinstance(position, int) else ""
        return f"request body is not valid JSON{where}: {reason}".rstrip(": ")
    if error["type"] == "missing" and location == "":
        return "request body is required"
    if location == "":
        return f"request body: {error['msg']}"
    return f"{location}: {error['msg']}"


CUSTOM_ERROR_TYPES = frozenset({"invalid_input", "unknown_algorithm", "unknown_parameter"})


def validation_problem(
    errors: Sequence[Any], *, instance: str, strip_tags: frozenset[str] = frozenset()
) -> JSONResponse:
    """422 problem listing every validation error with its field location."""
    cleaned: list[dict[str, Any]] = []
    for raw in errors:
        loc = [part for part in raw["loc"] if part not in strip_tags]
        error = {"loc": loc, "msg": raw["msg"], "type": raw["type"]}
        if "ctx" in raw:
            error["ctx"] = {key: str(value) for key, value in raw["ctx"].items()}
        cleaned.append(error)
    detail = "; ".join(dict.fromkeys(_describe_validation_error(error) for error in cleaned))
    return problem_response(
        status=422, detail=detail, instance=instance, slug="validation-error", errors=cleaned
    )


def install_problem_handlers(app: FastAPI, *, union_tags: frozenset[str]) -> None:
    """Make every error of ``app`` an RFC 9457 problem.

    ``union_tags`` are discriminator tags pydantic inserts into error locations of tagged
    unions (the algorithm names); they are removed so locations read like the request body.
    """

    async def handle_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(
            status=exc.status,
            detail=exc.detail,
            instance=request.url.path,
            slug=exc.slug,
            errors=exc.errors,
        )

    async def handle_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_problem(exc.errors(), instance=request.url.path, strip_tags=union_tags)

    async def handle_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        phrase = HTTPStatus(exc.status_code).phrase
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else None
        if detail is None:
            detail = (
                f"no route matches {request.method} {request.url.path}"
                if exc.status_code == 404
                else f"{request.method} is not allowed on {request.url.path}"
                if exc.status_code == 405
                else phrase
            )
        return problem_response(
            status=exc.status_code,
            detail=detail,
            instance=request.url.path,
            headers=dict(exc.headers) if exc.headers else None,
        )

    async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            status=500,
            detail="the server failed to handle the request; see the server log",
            instance=request.url.path,
        )

    app.add_exception_handler(ProblemError, handle_problem)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(Exception, handle_unexpected)
