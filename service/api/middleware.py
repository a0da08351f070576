"""ASGI middleware: the request body size limit, request metrics, request ids and the web
page's security headers."""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import request_id_var
from service.metrics import ServiceMetrics
from service.problems import problem_response


def _too_large(limit: int, setting: str) -> str:
    return f"request body exceeds the limit of {limit} bytes ({setting})"


UPLOAD_PATHS = frozenset({"/datasets"})
"""Paths whose non-JSON POST bodies are file uploads, read in blocks: they have their own,
larger limit."""


class BodySizeLimitMiddleware:
    """Answer 413 to a body larger than ``max_body_bytes`` (file uploads: ``max_upload_bytes``).

    The declared ``Content-Length`` is checked first; the bytes actually received are counted
    too, for chunked uploads and lying clients.
    """

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes if max_upload_bytes is not None else max_body_bytes

    def _limit(self, scope: Scope) -> tuple[int, str]:
        """The limit on this request's body and the setting that sets it."""
        if scope["method"] == "POST" and scope["path"] in UPLOAD_PATHS:
            for name, value in scope["headers"]:
                if name == b"content-type":
                    if not value.lower().startswith(b"application/json"):
                        return self.max_upload_bytes, "MIXREG_MAX_UPLOAD_BYTES"
                    break
        return self.max_body_bytes, "MIXREG_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit(scope)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = problem_response(
                    status=413,
                    detail=_too_large(limit, setting),
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
                    raise HTTPException(413, detail=_too_large(limit, setting))
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


REQUEST_ID_HEADER = "X-Request-ID"
# An incoming id is kept when it is short printable ASCII (it is echoed and logged as is).
_REQUEST_ID_PATTERN = re.compile(r"[\x21-\x7e]{1,128}")


class RequestIdMiddleware:
    """Give every request an id: the caller's ``X-Request-ID`` when it is usable, else a new
    one. It is echoed in the response's ``X-Request-ID`` and set on every log line written
    while the request is handled."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = incoming if _REQUEST_ID_PATTERN.fullmatch(incoming) else uuid.uuid4().hex
        token = request_id_var.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


UI_PREFIX = "/ui"

UI_CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "img-src 'self'",
        "style-src 'self'",
        "script-src 'none'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
"""What the web page may load and where it may be shown: its own styles and pictures, no
script at all (it has none), forms posting only here, and never inside another site's frame,
where a page could trick a click on "sign out"."""


class UiSecurityHeadersMiddleware:
    """Add the page's ``Content-Security-Policy`` and ``X-Frame-Options: DENY`` (for browsers
    without ``frame-ancestors``) to every answer under ``/ui``, refusals and redirects too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = UI_CONTENT_SECURITY_POLICY
                headers["X-Frame-Options"] = "DENY"
                headers["X-Content-Type-Options"] = "nosniff"
            await send(message)

        await self.app(scope, receive, send_with_policy)
