"""ASGI middleware: the request body size limit and request metrics."""

from __future__ import annotations

import time

from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import problem_response
from service.api.metrics import ServiceMetrics


def _too_large(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes (MIXREG_MAX_BODY_BYTES)"


class BodySizeLimitMiddleware:
    """Answer 413 to a body larger than ``max_body_bytes``.

    The declared ``Content-Length`` is checked first; the bytes actually received are counted
    too, for chunked uploads and lying clients.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = problem_response(
                    status=413,
                    detail=_too_large(limit),
                    instance=scope["path"],
                    slug="payload-too-large",
                )
                await response(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes through FastAPI's body parsing to the handler.
                    raise HTTPException(413, detail=_too_large(limit))
            return message

        await self.app(scope, counting_receive, send)


class MetricsMiddleware:
    """Count requests and time them by route template (``/jobs/{job_id}``, not the id)."""

    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched") if isinstance(route, BaseRoute) else None
            template = template or "unmatched"
            self.metrics.observe_request(
                method=scope["method"],
                route=str(template),
                status=status,
                seconds=time.perf_counter() - started,
            )
