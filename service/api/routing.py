"""Routes whose big JSON bodies are parsed and validated in a worker thread, not on the loop."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.types import Receive, Scope

OFF_LOOP_BODY_BYTES = 64 * 1024
"""JSON bodies larger than this are parsed and validated in the thread pool."""


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


async def _validate_big_json(request: Request, body: bytes, adapter: TypeAdapter[Any]) -> Any:
    """The body validated in a worker thread if it is big JSON; None if it is not, or does not
    validate (the route's own parsing then reports it in the usual way)."""
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if len(body) <= OFF_LOOP_BODY_BYTES or not media_type.lower().endswith("json"):
        return None
    try:
        return await run_in_threadpool(adapter.validate_json, body)
    except ValidationError:
        return None


def off_loop_json_route(body_type: Any) -> type[APIRoute]:
    """A route class whose routes take a JSON body of ``body_type`` and parse and validate a big
    one in the thread pool: tens of megabytes of inline data take seconds, during which the
    event loop would answer nobody. The OpenAPI description stays the route's own."""
    adapter: TypeAdapter[Any] = TypeAdapter(body_type)

    class OffLoopJSONRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                # Read through the request the error handlers see, which keeps the body.
                body = await request.body()
                validated = await _validate_big_json(request, body, adapter)
                return await handler(
                    _ValidatedBodyRequest(
                        request.scope, request.receive, body=body, validated=validated
                    )
                )

            return handle

    return OffLoopJSONRoute
