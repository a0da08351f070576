"""The fit route, whose big JSON bodies are parsed and validated in a child process, not on
the event loop."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope

from service.data import json_bodies
from service.jobs.submit import PreparedFit, parse_fit_body


class _ValidatedBodyRequest(Request):
    """A request whose body was read already and, if it is big JSON, validated
    (``json()`` returns the validated value)."""

    def __init__(self, scope: Scope, receive: Receive, *, body: bytes, validated: Any) -> None:
        super().__init__(scope, receive)
        self._read_body = body
        self._validated = validated

    async def body(self) -> bytes:
        """The body, as read before."""
        return self._read_body

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """The body, as read before, in one piece."""
        yield self._read_body
        yield b""

    async def json(self) -> Any:
        """The validated body if there is one (validating it again costs next to nothing)."""
        if self._validated is not None:
            return self._validated
        return await super().json()


async def _prepare_big_json(request: Request, body: bytes) -> PreparedFit | None:
    """The fit of a big JSON body, validated and prepared in a child process; None for any
    other body (the route's own parsing takes it). Raises ``RequestValidationError`` for a big
    body that does not validate, so that it is not parsed once more on the loop."""
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if len(body) <= json_bodies.PARSE_IN_A_CHILD_BYTES or not media_type.lower().endswith("json"):
        return None
    prepared = await json_bodies.in_a_child(parse_fit_body, body)
    if isinstance(prepared, list):
        raise RequestValidationError(prepared)
    return prepared


def prepared_fit(request: Request) -> PreparedFit | None:
    """The fit :class:`OffLoopFitRoute` prepared from a big body; None for a small body."""
    prepared: PreparedFit | None = getattr(request.state, "prepared_fit", None)
    return prepared


class OffLoopFitRoute(APIRoute):
    """A route taking a fit request whose big JSON body (tens of megabytes of inline data take
    seconds to parse, and hold the GIL all along) is parsed, validated and turned into arrays
    in a child process; the route finds the result with :func:`prepared_fit`. The OpenAPI
    description stays the route's own."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            # Read through the request the error handlers see, which keeps the body.
            body = await request.body()
            prepared = await _prepare_big_json(request, body)
            request.state.prepared_fit = prepared
            validated = prepared.request if prepared is not None else None
            return await handler(
                _ValidatedBodyRequest(
                    request.scope, request.receive, body=body, validated=validated
                )
            )

        return handle
