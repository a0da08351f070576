"""Signed session cookies: a browser signs in to the web page once with an API key, then
reads the page, its pictures and its styles with a cookie instead of a header.

A session names its key and when it ends, signed with HMAC-SHA256 under a secret derived from
the key's stored hash, so every API process of the server checks it without shared state, and
revoking the key ends its sessions at once. A session grants reads only, whatever the key's
scope (docs/adr: sign-in to the web page).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, replace

from service.auth.keys import ApiKey, KeyRing

SESSION_COOKIE = "mixreg_session"
CSRF_COOKIE = "mixreg_csrf"
_SESSION = re.compile(
    r"(?P<key_id>[0-9a-f]{12})\.(?P<expires>[0-9]{1,12})\.(?P<mac>[\w-]{43})",
    # ASCII only: \w alone matches any letter, and compare_digest refuses non-ASCII str.
    re.ASCII,
)


def _mac(record: ApiKey, message: str) -> str:
    secret = hashlib.sha256(f"mixreg-ui-session:{record.key_hash}".encode()).digest()
    digest = hmac.new(secret, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Session:
    """A signed-in browser: its key (narrowed to reads) and the cookie that carries it."""

    key: ApiKey
    cookie: str
    expires_at: int


def new_session(record: ApiKey, *, lifetime_s: int, now: float | None = None) -> Session:
    """A session of ``record`` that ends ``lifetime_s`` seconds from ``now``."""
    expires_at = int((time.time() if now is None else now) + lifetime_s)
    message = f"{record.id}.{expires_at}"
    return Session(
        key=replace(record, scope="read"),
        cookie=f"{message}.{_mac(record, message)}",
        expires_at=expires_at,
    )


def session_of(cookie: str, keyring: KeyRing, *, now: float | None = None) -> Session | None:
    """The session ``cookie`` carries; None if it is malformed, forged, expired, or its key
    is unknown or revoked."""
    match = _SESSION.fullmatch(cookie)
    if match is None:
        return None
    record = keyring.get(match["key_id"])
    expires_at = int(match["expires"])
    if record is None or record.revoked or expires_at <= (time.time() if now is None else now):
        return None
    expected = _mac(record, f"{record.id}.{expires_at}")
    if not hmac.compare_digest(expected, match["mac"]):
        return None
    return Session(key=replace(record, scope="read"), cookie=cookie, expires_at=expires_at)


def new_csrf_token() -> str:
    """A random token for the sign-in form, also set as a cookie (double submit)."""
    return secrets.token_urlsafe(32)


def sign_out_token(session_cookie: str) -> str:
    """The token the sign-out form carries: derived from the session, which a page of another
    site cannot read."""
    digest = hashlib.sha256(f"mixreg-ui-sign-out:{session_cookie}".encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
