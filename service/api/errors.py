"""RFC 9457 problem details: the one error shape of every endpoint, and the one place that
gives each domain error (``service.errors``) its HTTP status."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from pydantic_core import from_json
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.errors import (
    ConflictError,
    DataTooLargeError,
    InvalidInputError,
    LimitExceededError,
    NotAcceptableError,
    NotFoundError,
    ServiceError,
    ServiceUnavailableError,
    TooManyJobsError,
    UnsupportedMediaTypeError,
)
from service.problems import problem_response

logger = logging.getLogger(__name__)


# The HTTP status of each kind of domain error; a subclass not listed has its base's.
STATUS_OF_ERROR: dict[type[ServiceError], int] = {
    ServiceError: 400,
    InvalidInputError: 422,
    NotFoundError: 404,
    ConflictError: 409,
    UnsupportedMediaTypeError: 415,
    NotAcceptableError: 406,
    LimitExceededError: 422,
    DataTooLargeError: 413,
    TooManyJobsError: 429,
    ServiceUnavailableError: 503,
}


def status_of(error: ServiceError) -> int:
    """The HTTP status of ``error``: that of its class, or of its nearest listed base."""
    return next(STATUS_OF_ERROR[kind] for kind in type(error).__mro__ if kind in STATUS_OF_ERROR)


def error_problem(error: ServiceError, *, instance: str) -> JSONResponse:
    """The problem+json response to a domain error (with ``Retry-After`` when it has one)."""
    headers = (
        {"Retry-After": str(error.retry_after_s)}
        if isinstance(error, TooManyJobsError | ServiceUnavailableError)
        else None
    )
    return problem_response(
        status=status_of(error),
        detail=error.detail,
        instance=instance,
        slug=error.slug,
        errors=error.errors,
        headers=headers,
    )


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
    if error["type"] == "missing" and location in MISSING_FIELD_HINTS:
        return MISSING_FIELD_HINTS[location]
    if location == "":
        return f"request body: {error['msg']}"
    return f"{location}: {error['msg']}"


CUSTOM_ERROR_TYPES = frozenset({"invalid_input", "unknown_algorithm", "unknown_parameter"})
# What to send when a required field is missing, for fields whose name alone does not say.
MISSING_FIELD_HINTS = {
    "k": 'k is required: the number of lines to fit, e.g. "k": 2 (a list such as [1, 2, 3] '
    "fits one model per k)",
}


def _not_sent_as_json(request: Request, errors: Sequence[Any]) -> JSONResponse | None:
    """415 naming the header to send, when a JSON body came with another Content-Type.

    FastAPI then validates the raw bytes instead of parsed JSON, and the errors would only
    say that the body is not an object.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type or content_type == "application/json" or content_type.endswith("+json"):
        return None
    if not any(tuple(error["loc"][:1]) == ("body",) for error in errors):
        return None
    return problem_response(
        status=415,
        detail=f"{request.method} {request.url.path} reads a JSON body, but the request says "
        f"Content-Type: {content_type}; send the header Content-Type: application/json "
        f"(curl -d sends application/x-www-form-urlencoded unless given "
        f"-H 'Content-Type: application/json')",
        instance=request.url.path,
        slug="unsupported-media-type",
    )


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


# FastAPI's detail when its JSON parser raises anything but a syntax error: invalid UTF-8, or
# nesting deeper than Python's recursion limit.
_FASTAPI_BODY_PARSE_FAILURE = "There was an error parsing the body"


async def _json_syntax_errors(request: Request) -> list[dict[str, Any]] | None:
    """Why the request body is not JSON, as the one parser of every endpoint words it.

    FastAPI (Python's ``json``) and pydantic (for ``POST /datasets``) word the same fault
    differently, and FastAPI not at all for invalid UTF-8 or deep nesting; the body is parsed
    once more here, on the error path only, so every endpoint gives the same detail.
    """
    try:
        body = await request.body()
    except RuntimeError:  # the stream was read elsewhere and not kept
        return None
    try:
        from_json(body)
    except ValueError as exc:
        reason = str(exc)
        return [
            {
                "type": "json_invalid",
                "loc": ("body",),
                "msg": f"Invalid JSON: {reason}",
                "ctx": {"error": reason},
            }
        ]
    return None


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the path accepts (Starlette's 405 names only the first
    route's, though ``GET`` and ``DELETE /models/{id}`` are two routes)."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        if route.methods and route.matches(request.scope)[0] in (Match.FULL, Match.PARTIAL):
            methods |= route.methods
    return sorted(methods)


def install_problem_handlers(app: FastAPI, *, union_tags: frozenset[str]) -> None:
    """Make every error of ``app`` an RFC 9457 problem.

    ``union_tags`` are discriminator tags pydantic inserts into error locations of tagged
    unions (the algorithm names); they are removed so locations read like the request body.
    """

    async def handle_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return error_problem(exc, instance=request.url.path)

    async def handle_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        wrong_media_type = _not_sent_as_json(request, errors)
        if wrong_media_type is not None:
            return wrong_media_type
        if any(error["type"] == "json_invalid" for error in errors):
            errors = await _json_syntax_errors(request) or errors
        return validation_problem(errors, instance=request.url.path, strip_tags=union_tags)

    async def handle_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_PARSE_FAILURE:
            errors = await _json_syntax_errors(request)
            if errors is not None:
                return validation_problem(errors, instance=request.url.path)
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
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return problem_response(
            status=exc.status_code,
            detail=detail,
            instance=request.url.path,
            headers=headers or None,
        )

    async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            status=500,
            detail="the server failed to handle the request; see the server log",
            instance=request.url.path,
        )

    app.add_exception_handler(ServiceError, handle_problem)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(Exception, handle_unexpected)
