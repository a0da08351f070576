"""Routes whose big JSON bodies are parsed and validated in a worker thread, not on the loop."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.types import Receive, Scope

OFF_LOOP_BODY_BYTES = 64 * 1024
"""JSON bodies larger than this are parsed and validated in the thread pool."""


class _ValidatedBodyRequest(Request):
    """A request whose JSON body may already be parsed and validated (``json()`` returns it)."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        super().__init__(scope, receive)
        self._validated: Any = None

    async def validate_json_body(self, adapter: TypeAdapter[Any]) -> None:
        """Read the body; if it is big JSON, parse and validate it in a worker thread.

        A body that does not validate is left to the route's own parsing, which reports it in
        the usual way.
        """
        body = await self.body()
        media_type = self.headers.get("content-type", "application/json").split(";")[0].strip()
        if len(body) <= OFF_LOOP_BODY_BYTES or not media_type.lower().endswith("json"):
            return
        try:
            self._validated = await run_in_threadpool(adapter.validate_json, body)
        except ValidationError:
            return

    async def json(self) -> Any:
        """The validated body if there is one (validating it again costs next to nothing)."""
        if self._validated is not None:
            return self._validated
        return await super().json()


def off_loop_json_route(body_type: Any) -> type[APIRoute]:
    """A route class whose routes take a JSON body of ``body_type`` and parse and validate a big
    one in the thread pool: tens of megabytes of inline data take seconds, during which the
    event loop would answer nobody. The OpenAPI description stays the route's own."""
    adapter: TypeAdapter[Any] = TypeAdapter(body_type)

    class OffLoopJSONRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                validated = _ValidatedBodyRequest(request.scope, request.receive)
                await validated.validate_json_body(adapter)
                return await handler(validated)

            return handle

    return OffLoopJSONRoute
