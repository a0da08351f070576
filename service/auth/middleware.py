"""The check of the API key of every request before anything else runs (the service's edge
middleware, :mod:`service.api.middleware`, runs it).

It sits in front of routing, so an unknown path, a body to parse or a route added later gets no
further than a missing key; only the open paths of ``policy`` pass without one (a valid key sent
to them is still recorded, for the details ``/readyz`` shows). The service has no websocket
endpoints: every websocket connection is refused before it is accepted, which the server
answers with an HTTP 403.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from http.cookies import CookieError, SimpleCookie
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from starlette.responses import RedirectResponse
from starlette.types import Receive, Scope, Send

from service.auth import policy
from service.auth.keys import ApiKey, InvalidKeyError, KeyRing, RevokedKeyError, looks_like_key
from service.auth.sessions import SESSION_COOKIE, Session, session_of
from service.problems import problem_response

logger = logging.getLogger(__name__)

REALM = "mixreg"
WEBSOCKET_POLICY_VIOLATION = 1008
"""The close code (RFC 6455) of a refused websocket connection."""
_STATE_KEY = "api_key"


def _challenge(error: str | None = None, **parameters: str) -> str:
    """A ``WWW-Authenticate`` value for the Bearer scheme (RFC 6750)."""
    fields = {"realm": REALM, **({"error": error} if error else {}), **parameters}
    return "Bearer " + ", ".join(f'{name}="{value}"' for name, value in fields.items())


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def is_local_client(client: tuple[str, int] | None) -> bool:
    """True for a loopback peer, or one that is not a network peer at all (a Unix socket)."""
    return True if client is None else _is_local_address(client[0])


@functools.lru_cache(maxsize=256)
def _is_local_address(host: str) -> bool:
    """Whether the peer address ``host`` is loopback or not an IP address; remembered, as a
    server sees few distinct peers and keyless requests check theirs every time."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def session_cookie(scope: Scope) -> str | None:
    """The value of the web page's session cookie, if the request has one."""
    for name, value in scope["headers"]:
        if name == b"cookie":
            cookies = SimpleCookie()
            try:
                cookies.load(value.decode("latin-1"))
            except CookieError:
                continue
            if SESSION_COOKIE in cookies:
                return cookies[SESSION_COOKIE].value
    return None


def _credential_in_query(scope: Scope) -> str | None:
    """The name of a query parameter that carries a key, if any."""
    raw: bytes = scope.get("query_string", b"")
    query = raw.decode("latin-1")
    if not query:
        return None
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name.lower() in policy.CREDENTIAL_QUERY_PARAMETERS or looks_like_key(value):
            return name
    return None


class AuthGate:
    """Refuse with 401, 403 or 400 (problem+json with ``WWW-Authenticate``) unless the request
    carries ``Authorization: Bearer <key>`` with a key of the scope it needs, or reads the web
    page with its signed session cookie (a browser without either is sent to sign in).

    Without keys (``keyring.enabled`` false) every request passes, but only from loopback
    clients unless ``allow_unauthenticated``.
    """

    def __init__(
        self,
        *,
        keyring: KeyRing,
        metrics_require_key: bool,
        allow_unauthenticated: bool,
    ) -> None:
        self.keyring = keyring
        self.metrics_open = not metrics_require_key
        self.allow_unauthenticated = allow_unauthenticated

    @staticmethod
    async def refuse_websocket(receive: Receive, send: Send) -> None:
        """Close a websocket connection before accepting it (the service has none)."""
        await receive()  # the connection request
        await send({"type": "websocket.close", "code": WEBSOCKET_POLICY_VIOLATION})

    async def admit(
        self, scope: Scope, receive: Receive, send: Send, *, authorization: list[str]
    ) -> bool:
        """True if the HTTP request may go on (its key, if any, is then in its state); else
        the refusal was sent. ``authorization``: the values of its ``Authorization`` headers."""
        path = route_path(scope)
        if policy.is_open(path, metrics_open=self.metrics_open) or policy.is_public_asset(
            scope["method"], path
        ):
            record = self._optional_key(authorization)
            if record is not None:
                scope.setdefault("state", {})[_STATE_KEY] = record
            return True
        if not self.keyring.enabled:
            if self.allow_unauthenticated or is_local_client(scope.get("client")):
                return True
            detail = (
                "this server has no API keys, so it answers only clients on its own machine; "
                "configure keys (MIXREG_API_KEYS_FILE or MIXREG_API_KEYS), or set "
                "MIXREG_ALLOW_UNAUTHENTICATED=true to serve anyone"
            )
            await self._refuse(scope, receive, send, status=403, slug="forbidden", detail=detail)
            return False
        parameter = _credential_in_query(scope)
        if parameter is not None:
            detail = (
                f"API keys are not accepted in the query string (parameter '{parameter}'): URLs "
                f"end up in logs and histories. Send the header Authorization: Bearer <key>, and "
                f"revoke that key, which may have leaked"
            )
            challenge = _challenge("invalid_request", error_description="key in the URL")
            await self._refuse(
                scope,
                receive,
                send,
                status=400,
                slug="credentials-in-url",
                detail=detail,
                challenge=challenge,
            )
            return False
        method: str = scope["method"]
        if not authorization and policy.accepts_session(method, path):
            session = self._session(scope)
            if session is not None:
                scope.setdefault("state", {})[_STATE_KEY] = session.key
                return True
            if policy.is_page(method, path):
                # A browser without a key or session: to the sign-in form, not a JSON problem.
                response = RedirectResponse(policy.SIGN_IN_PATH, status_code=303)
                await response(scope, receive, send)
                return False
        record = await self._authenticate(scope, receive, send, authorization)
        if record is None:
            return False
        needed = policy.required_scope(method, path)
        if not record.grants(needed):
            logger.info("API key %s (%s) refused on %s %s", record.id, record.scope, method, path)
            detail = (
                f"API key {record.id} has the scope '{record.scope}'; {method} {path} needs a key "
                f"with the scope '{needed}'"
            )
            challenge = _challenge("insufficient_scope", scope=needed)
            await self._refuse(
                scope,
                receive,
                send,
                status=403,
                slug="insufficient-scope",
                detail=detail,
                challenge=challenge,
            )
            return False
        scope.setdefault("state", {})[_STATE_KEY] = record
        return True

    def _optional_key(self, values: list[str]) -> ApiKey | None:
        """The valid, unrevoked key an open path was sent, if any (never a refusal)."""
        if not self.keyring.enabled:
            return None
        if len(values) != 1:
            return None
        scheme, _, credentials = values[0].strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return None
        try:
            return self.keyring.authenticate(credentials.strip())
        except (InvalidKeyError, RevokedKeyError):
            return None

    def _session(self, scope: Scope) -> Session | None:
        """The web page's session the request's cookie carries, if it is valid."""
        cookie = session_cookie(scope)
        return None if cookie is None else session_of(cookie, self.keyring)

    async def _authenticate(
        self, scope: Scope, receive: Receive, send: Send, values: list[str]
    ) -> ApiKey | None:
        """The key of the request (``values``: its ``Authorization`` headers), or None once a
        401 was sent."""
        if not values:
            detail = "this endpoint needs an API key: send the header Authorization: Bearer <key>"
            await self._unauthorized(scope, receive, send, detail, _challenge())
            return None
        scheme, _, credentials = values[0].strip().partition(" ")
        credentials = credentials.strip()
        if len(values) > 1 or scheme.lower() != "bearer" or not credentials:
            detail = (
                "the Authorization header must be a single 'Bearer <key>' "
                "(send the header Authorization: Bearer <key>)"
            )
            challenge = _challenge("invalid_request", error_description="not a bearer key")
            await self._unauthorized(scope, receive, send, detail, challenge)
            return None
        try:
            return self.keyring.authenticate(credentials)
        except RevokedKeyError as exc:
            logger.info("revoked API key %s presented", exc.record.id)
            detail = f"API key {exc.record.id} was revoked; ask for a new key"
            challenge = _challenge("invalid_token", error_description="the key was revoked")
        except InvalidKeyError:
            detail = "the API key is not valid"
            challenge = _challenge("invalid_token", error_description="unknown key")
        await self._unauthorized(scope, receive, send, detail, challenge)
        return None

    async def _unauthorized(
        self, scope: Scope, receive: Receive, send: Send, detail: str, challenge: str
    ) -> None:
        await self._refuse(
            scope,
            receive,
            send,
            status=401,
            slug="unauthorized",
            detail=detail,
            challenge=challenge,
        )

    @staticmethod
    async def _refuse(
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        status: int,
        slug: str,
        detail: str,
        challenge: str | None = None,
    ) -> None:
        response = problem_response(
            status=status,
            detail=detail,
            instance=scope["path"],
            slug=slug,
            headers={"WWW-Authenticate": challenge} if challenge else None,
        )
        await response(scope, receive, send)


def request_api_key(request: Request) -> ApiKey | None:
    """The key the request was made with; None when the server has no keys."""
    record: ApiKey | None = request.scope.get("state", {}).get(_STATE_KEY)
    return record


ApiKeyDep = Annotated[ApiKey | None, Depends(request_api_key)]


def access_summary(keyring: KeyRing, *, allow_unauthenticated: bool) -> tuple[int, str]:
    """The log level and sentence that say at start-up who may call the server."""
    if not keyring.enabled:
        who = (
            "any client (MIXREG_ALLOW_UNAUTHENTICATED=true)"
            if allow_unauthenticated
            else "clients on this machine (loopback) only"
        )
        return logging.WARNING, (
            f"no API keys are configured: the API is UNAUTHENTICATED and answers {who}; set "
            f"MIXREG_API_KEYS_FILE and create keys with `mixreg keys create` to require them"
        )
    sources = [
        source
        for source, present in (
            (f"file {keyring.file}", keyring.file is not None),
            ("MIXREG_API_KEYS", any(key.source == "environment" for key in keyring.keys)),
        )
        if present
    ]
    active = sum(not key.revoked for key in keyring.keys)
    if active == 0:
        return logging.WARNING, (
            f"API keys are required but none is active yet ({', '.join(sources)}); every "
            f"request but the health probes is refused until one is created with "
            f"`mixreg keys create --scope write`"
        )
    return logging.INFO, f"API keys are required: {active} active ({', '.join(sources)})"
