"""Signing in to the web page with an API key, and out again.

The form posts the key once; the answer sets a signed session cookie (``HttpOnly``,
``SameSite=Strict``, ``Secure`` over HTTPS) that lets the browser read the page, its pictures
and its styles until it expires (``MIXREG_UI_SESSION_S``) or the key is revoked. Both forms
are safe from cross-site posts: sign-in by a token in the form and in a cookie (double
submit) and by the ``Origin`` header, sign-out by a token derived from the session.
"""

from __future__ import annotations

import hmac
from datetime import UTC, datetime
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from service.auth import policy
from service.auth.keys import InvalidKeyError, KeyRing, RevokedKeyError
from service.auth.origin import same_origin
from service.auth.sessions import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    new_csrf_token,
    new_session,
    sign_out_token,
)
from service.config import Settings

# Seconds a sign-in form may be left open before it is sent.
CSRF_LIFETIME_S = 3600

router = APIRouter(include_in_schema=False)


def _scheme(request: Request) -> str:
    """The scheme the browser used: the connection's, or the one a trusted proxy forwarded
    (uvicorn's proxy headers, ``--forwarded-allow-ips``, rewrite the scope's scheme)."""
    scheme: str = request.scope.get("scheme", "http")
    return scheme


def _secure(request: Request) -> bool:
    return _scheme(request) == "https"


def _same_origin(request: Request) -> bool:
    """Whether the form was sent from a page of this server (browsers send ``Origin`` with
    every POST; a client that sends none is not a browser on another site): same scheme as
    the request, same host and port (a default port written or not)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).scheme == _scheme(request) and same_origin(
        origin, request.headers.get("host", "")
    )


def _tokens_match(presented: str, expected: str) -> bool:
    """Constant-time equality of two form tokens. ``hmac.compare_digest`` refuses ``str``
    with characters beyond ASCII (TypeError), and a forged form may carry any: compare the
    UTF-8 bytes, so such a token is simply wrong."""
    return hmac.compare_digest(presented.encode(), expected.encode())


def _form_page(
    request: Request, templates: Jinja2Templates, *, error: str | None, status_code: int
) -> HTMLResponse:
    token = new_csrf_token()
    response = templates.TemplateResponse(
        request,
        "sign_in.html",
        {"csrf": token, "error": error, "now": datetime.now(UTC)},
        status_code=status_code,
    )
    response.set_cookie(
        CSRF_COOKIE,
        token,
        max_age=CSRF_LIFETIME_S,
        path=policy.SIGN_IN_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="strict",
    )
    return response


def install(templates: Jinja2Templates) -> APIRouter:
    """The sign-in and sign-out routes, rendered with ``templates``."""

    @router.get(policy.SIGN_IN_PATH, response_class=HTMLResponse)
    def sign_in_form(request: Request) -> Response:
        """The form that asks for an API key."""
        keyring: KeyRing = request.app.state.keyring
        if not keyring.enabled:
            return RedirectResponse("/ui", status_code=303)
        return _form_page(request, templates, error=None, status_code=200)

    @router.post(policy.SIGN_IN_PATH, response_class=HTMLResponse)
    async def sign_in(request: Request) -> Response:
        """Check the key and the form's token; set the session cookie."""
        keyring: KeyRing = request.app.state.keyring
        settings: Settings = request.app.state.settings
        if not keyring.enabled:
            return RedirectResponse("/ui", status_code=303)
        async with request.form() as form:
            key, token = form.get("api_key"), form.get("csrf")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if (
            not isinstance(token, str)
            or not cookie
            or not _tokens_match(token, cookie)
            or not _same_origin(request)
        ):
            return _form_page(
                request,
                templates,
                error="the form was not sent from this page, or was open too long; sign in again",
                status_code=403,
            )
        try:
            record = keyring.authenticate(key if isinstance(key, str) else "")
        except RevokedKeyError as exc:
            error = f"API key {exc.record.id} was revoked; ask for a new key"
        except InvalidKeyError:
            error = "that is not a valid API key (mixreg keys create makes one)"
        else:
            session = new_session(record, lifetime_s=settings.ui_session_s)
            response = RedirectResponse("/ui", status_code=303)
            response.set_cookie(
                SESSION_COOKIE,
                session.cookie,
                max_age=settings.ui_session_s,
                path="/",
                secure=_secure(request),
                httponly=True,
                samesite="strict",
            )
            response.delete_cookie(CSRF_COOKIE, path=policy.SIGN_IN_PATH)
            return response
        return _form_page(request, templates, error=error, status_code=401)

    @router.post(policy.SIGN_OUT_PATH)
    async def sign_out(request: Request) -> Response:
        """End the browser's session (its form carries the session's sign-out token)."""
        session = request.cookies.get(SESSION_COOKIE)
        async with request.form() as form:
            token = form.get("token")
        if (
            session is None
            or not isinstance(token, str)
            or not _tokens_match(token, sign_out_token(session))
        ):
            return Response("sign-out refused: the form was not sent from this page", 403)
        response = RedirectResponse(policy.SIGN_IN_PATH, status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/", secure=_secure(request), httponly=True)
        return response

    return router


def signed_in_as(request: Request) -> dict[str, str] | None:
    """The key id and sign-out token of a browser signed in with a session, for the page."""
    session = request.cookies.get(SESSION_COOKIE)
    if session is None or "authorization" in request.headers:
        return None
    record = request.scope.get("state", {}).get("api_key")
    if record is None:
        return None
    return {"key_id": record.id, "sign_out_token": sign_out_token(session)}
