"""Who may call what: the few open paths, and the scope every other request needs.

Everything not listed here as open needs a key, so a route added later is protected by default;
a request that changes state needs ``write`` unless it is listed below as a read.
"""

from __future__ import annotations

import ipaddress
import re

from service.auth.keys import Scope

# Where the offline API docs serve their scripts and styles (open, as the docs pages are).
DOCS_STATIC = "/static-offline-docs"
OPEN_PATHS = frozenset(
    {
        # Probes of load balancers and orchestrators, which carry no credentials.
        "/healthz",
        "/readyz",
        "/v2/health/live",
        "/v2/health/ready",
        # The interface description: it holds no data, and clients and the docs page need it
        # before they have a key (the page asks for one with its "Authorize" button).
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
    }
)
OPEN_PREFIXES = (
    # The docs pages' own scripts and styles (served from the installed package, offline).
    f"{DOCS_STATIC}/",
)
METRICS_PATH = "/metrics"

# The web page's sign-in and sign-out: open, as a browser has no key to send yet; they check
# the key and their forms' CSRF tokens themselves.
SIGN_IN_PATH = "/ui/sign-in"
SIGN_OUT_PATH = "/ui/sign-out"
# Pages a browser opens: without a key or session it is sent to the sign-in page.
_PAGES = (re.compile(r"/"), re.compile(r"/ui"), re.compile(r"/ui/models/[^/]+"))
# What the page shows and loads, which a signed-in browser reads with its session cookie.
_SESSION_READS = (
    *_PAGES,
    re.compile(r"/ui/static/.+"),
    re.compile(r"/models/[^/]+/plot\.png"),
    re.compile(r"/jobs/[^/]+/plot\.png"),
)

# The page's static files (its styles): public, so that the sign-in page, shown before a
# session exists, is styled; they are part of the installed package and hold no data.
_PUBLIC_ASSETS = re.compile(r"/ui/static/[A-Za-z0-9_-][A-Za-z0-9._-]*")

# Reads: their methods change nothing.
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Predictions are reads sent with POST (they carry rows in the body) and change nothing.
_READ_POSTS = (
    re.compile(r"/predict"),
    re.compile(r"/models/[^/]+/predict"),
    re.compile(r"/models/[^/]+/versions/[^/]+/predict"),
    re.compile(r"/v2/models/[^/]+(?:/versions/[^/]+)?/infer"),
)

# Query parameters in which clients commonly put a bearer token (RFC 6750 allows
# access_token); keys there end up in access logs and browser histories, so they are refused.
CREDENTIAL_QUERY_PARAMETERS = frozenset({"access_token", "api_key", "apikey", "api-key"})


def is_open(path: str, *, metrics_open: bool) -> bool:
    """Whether ``path`` answers without a key (``/metrics`` only when ``metrics_open``)."""
    if (
        path in OPEN_PATHS
        or path.startswith(OPEN_PREFIXES)
        or path in (SIGN_IN_PATH, SIGN_OUT_PATH)
    ):
        return True
    return metrics_open and path == METRICS_PATH


def is_public_asset(method: str, path: str) -> bool:
    """Whether the request reads one of the page's static files, which answer without a key."""
    return method in ("GET", "HEAD") and _PUBLIC_ASSETS.fullmatch(path) is not None


def required_scope(method: str, path: str) -> Scope:
    """The scope a request needs: ``read`` for reads and predictions, else ``write``."""
    if method in _READ_METHODS:
        return "read"
    if method == "POST" and any(pattern.fullmatch(path) for pattern in _READ_POSTS):
        return "read"
    return "write"


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve to any interface


def bind_refusal(host: str, *, keys_configured: bool, allow_unauthenticated: bool) -> str | None:
    """Why a server without keys must not bind ``host``, or None if it may."""
    if keys_configured or allow_unauthenticated or is_loopback_host(host):
        return None
    return (
        f"refusing to serve on {host} without API keys: anyone who reaches that interface "
        f"could fit, read and delete everything. Set MIXREG_API_KEYS_FILE (and create keys with "
        f"`mixreg keys create --scope write`), bind 127.0.0.1, or set "
        f"MIXREG_ALLOW_UNAUTHENTICATED=true to serve the network without keys"
    )


def accepts_session(method: str, path: str) -> bool:
    """Whether a request may be made with the web page's session cookie instead of a key:
    reads of the page, its pictures and its styles."""
    return method in ("GET", "HEAD") and any(pattern.fullmatch(path) for pattern in _SESSION_READS)


def is_page(method: str, path: str) -> bool:
    """Whether the request opens a page in a browser (sent to sign in when it has no key)."""
    return method in ("GET", "HEAD") and any(pattern.fullmatch(path) for pattern in _PAGES)
