"""The service's one ASGI middleware, in front of routing: :class:`EdgeMiddleware`.

It does, in this order, in one layer (each step used to be a middleware of its own, and
every layer cost a call and a wrapped ``send`` per request):

1. the request id: the caller's ``X-Request-ID`` when it is usable, else a new one; echoed in
   the answer and set on every log line written while the request is handled;
2. the web page's security headers on every answer under ``/ui``, refusals and redirects too;
3. request metrics (by route template) and the access line, for refusals too;
4. the browser guard (``Host``, cross-site writes: :class:`service.auth.origin.BrowserGuard`);
5. the key check (:class:`service.auth.middleware.AuthGate`);
6. the body size limit (413);
7. then either the app, or for a small JSON ``POST /predict`` of a cached model the
   prediction itself (:func:`service.serving.endpoint.fast_json_predict`), without routing,
   dependencies or a pydantic body: anything it does not answer goes on to the app, the body
   read so far replayed, and gets the same answer it always had (errors included).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth.middleware import AuthGate, route_path
from service.auth.origin import BrowserGuard
from service.logs import AccessLog, request_id_var
from service.metrics import ServiceMetrics
from service.problems import problem_response
from service.serving.endpoint import EncodedAnswer


def _too_large(limit: int, setting: str) -> str:
    return f"request body exceeds the limit of {limit} bytes ({setting})"


UPLOAD_PATHS = frozenset({"/datasets"})
"""Paths whose non-JSON POST bodies are file uploads, read in blocks: they have their own,
larger limit."""


class BodySizeLimit:
    """The limit on a request's body: ``max_body_bytes`` (file uploads: ``max_upload_bytes``).

    The declared ``Content-Length`` is checked first; the bytes actually received are counted
    too, for chunked uploads and lying clients.
    """

    def __init__(self, *, max_body_bytes: int, max_upload_bytes: int | None = None) -> None:
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes if max_upload_bytes is not None else max_body_bytes

    def limit(self, scope: Scope, content_type: str | None) -> tuple[int, str]:
        """The limit on this request's body and the setting that sets it."""
        if (
            scope["method"] == "POST"
            and scope["path"] in UPLOAD_PATHS
            and content_type is not None
            and not content_type.lower().startswith("application/json")
        ):
            return self.max_upload_bytes, "MIXREG_MAX_UPLOAD_BYTES"
        return self.max_body_bytes, "MIXREG_MAX_BODY_BYTES"

    @staticmethod
    def refusal(scope: Scope, declared: str | None, limit: int, setting: str) -> Response | None:
        """The 413 of a declared ``Content-Length`` over ``limit``, or None."""
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return problem_response(
                status=413,
                detail=_too_large(limit, setting),
                instance=scope["path"],
                slug="payload-too-large",
            )
        return None

    @staticmethod
    def counting(receive: Receive, limit: int, setting: str) -> Receive:
        """``receive``, raising a 413 once more than ``limit`` bytes were received."""
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

        return counting_receive


REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID_RAW = REQUEST_ID_HEADER.lower().encode("latin-1")
# An incoming id is kept when it is short printable ASCII (it is echoed and logged as is).
_REQUEST_ID_PATTERN = re.compile(r"[\x21-\x7e]{1,128}")

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

UI_HEADERS = {
    "Content-Security-Policy": UI_CONTENT_SECURITY_POLICY,
    # For browsers without frame-ancestors.
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}

PREDICT_PATH = "/predict"

# The request headers the edge reads, by their raw (lower-case) names.
_READ_HEADERS = frozenset(
    {
        b"host",
        b"origin",
        b"sec-fetch-site",
        b"content-type",
        b"content-length",
        b"accept",
        _REQUEST_ID_RAW,
    }
)

FastPredict = Callable[[bytes, str | None, str | None], EncodedAnswer | None]
"""Answers a predict body (given its ``Content-Type`` and ``Accept``) or declines with None."""


class EdgeMiddleware:
    """Every step that runs before routing, in one ASGI layer (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ServiceMetrics,
        browser_guard: BrowserGuard,
        auth: AuthGate,
        body_limit: BodySizeLimit,
        access_log: AccessLog,
        fast_predict: FastPredict | None = None,
        fast_predict_bytes: int = 0,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.browser_guard = browser_guard
        self.auth = auth
        self.body_limit = body_limit
        self.access_log = access_log
        self.fast_predict = fast_predict
        self.fast_predict_bytes = fast_predict_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "websocket":
                await self.auth.refuse_websocket(receive, send)
            else:  # lifespan
                await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # One pass over the headers: the first value of each the edge reads (as Starlette's
        # Headers.get gives it), and every Authorization value.
        headers: dict[bytes, str] = {}
        authorization: list[str] = []
        for raw_name, raw_value in scope["headers"]:
            if raw_name == b"authorization":
                authorization.append(raw_value.decode("latin-1"))
            elif raw_name in _READ_HEADERS and raw_name not in headers:
                headers[raw_name] = raw_value.decode("latin-1")
        incoming = headers.get(_REQUEST_ID_RAW)
        request_id = (
            incoming
            if incoming is not None and _REQUEST_ID_PATTERN.fullmatch(incoming)
            else uuid.uuid4().hex
        )
        token = request_id_var.set(request_id)
        path: str = scope["path"]
        ui = path == UI_PREFIX or path.startswith(UI_PREFIX + "/")
        id_header = (_REQUEST_ID_RAW, request_id.encode("latin-1"))
        status = 500
        fast = False

        async def edge_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if ui:
                    answer_headers = MutableHeaders(scope=message)
                    answer_headers[REQUEST_ID_HEADER] = request_id
                    for name, value in UI_HEADERS.items():
                        answer_headers[name] = value
                else:
                    message["headers"] = [
                        *(
                            header
                            for header in message.get("headers", ())
                            if header[0].lower() != _REQUEST_ID_RAW
                        ),
                        id_header,
                    ]
            await send(message)

        try:
            refusal = self.browser_guard.refusal(
                scope,
                host=headers.get(b"host", ""),
                origin=headers.get(b"origin"),
                sec_fetch_site=headers.get(b"sec-fetch-site"),
            )
            if refusal is not None:
                await refusal(scope, receive, edge_send)
                return
            if not await self.auth.admit(scope, receive, edge_send, authorization=authorization):
                return
            content_type = headers.get(b"content-type")
            limit, setting = self.body_limit.limit(scope, content_type)
            declared = headers.get(b"content-length")
            too_large = self.body_limit.refusal(scope, declared, limit, setting)
            if too_large is not None:
                await too_large(scope, receive, edge_send)
                return
            if (
                self.fast_predict is not None
                and scope["method"] == "POST"
                and not scope["query_string"]
                and declared is not None
                and declared.isdigit()
                and int(declared) <= min(limit, self.fast_predict_bytes)
                and route_path(scope) == PREDICT_PATH
            ):
                replayed = await self._predict_fast(scope, receive, edge_send, headers)
                if replayed is None:
                    fast = True
                    return
                receive = replayed
            await self.app(scope, self.body_limit.counting(receive, limit, setting), edge_send)
        finally:
            self._observe(scope, status, request_id, time.perf_counter() - started, fast=fast)
            request_id_var.reset(token)

    async def _predict_fast(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, str]
    ) -> Receive | None:
        """Answer a predict request here if ``fast_predict`` does (None), else the ``receive``
        to hand the app, which gives the body's messages read here first."""
        assert self.fast_predict is not None
        messages: list[Message] = []
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False) or size > self.fast_predict_bytes:
                break
        answer = None
        if messages[-1]["type"] == "http.request" and not messages[-1].get("more_body", False):
            answer = self.fast_predict(
                b"".join(chunks), headers.get(b"content-type"), headers.get(b"accept")
            )
        if answer is None:
            return _replaying(messages, receive)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                # As Starlette's Response(body, media_type=..., headers=...) writes them.
                "headers": [
                    *(
                        (name.lower().encode("latin-1"), value.encode("latin-1"))
                        for name, value in answer.headers.items()
                    ),
                    (b"content-length", str(len(answer.body)).encode("latin-1")),
                    (b"content-type", answer.media_type.encode("latin-1")),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})
        return None

    def _observe(
        self, scope: Scope, status: int, request_id: str, seconds: float, *, fast: bool
    ) -> None:
        """Count and time the request by its route template; log its access line (batched for
        the predictions answered here)."""
        template: str | None
        if fast:
            template = PREDICT_PATH
        else:
            route = scope.get("route")
            template = getattr(route, "path", None) if isinstance(route, BaseRoute) else None
        self.metrics.observe_request(
            method=scope["method"],
            route=str(template or "unmatched"),
            status=status,
            seconds=seconds,
        )
        self.access_log.record(scope, status, request_id, batched=fast)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then what ``receive`` gives."""
    pending = list(messages)

    async def replaying_receive() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replaying_receive
