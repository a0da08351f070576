"""Refuse requests that a web page, not the user, makes the browser send.

Two checks, with or without API keys, before the key is looked at:

- ``Host`` must be one of the allowed names (``MIXREG_ALLOWED_HOSTS``; loopback names by
  default). A page on ``evil.example`` that rebinds its name to 127.0.0.1 (DNS rebinding) sends
  ``Host: evil.example``, so it can neither read nor write. The health probes pass whatever
  their ``Host``: orchestrators call them by address and they hold nothing.
- A request that may change state (any method but GET, HEAD and OPTIONS) is refused when the
  browser says it comes from another site: an ``Origin`` that is not this server's own, or
  ``Sec-Fetch-Site: cross-site``. A form or ``fetch`` from another page sends a multipart
  ``POST`` without a CORS preflight; non-browser clients send neither header.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import Scope

from service.problems import problem_response

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names a server without ``MIXREG_ALLOWED_HOSTS`` answers to."""

PROBE_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def parse_allowed_hosts(value: str) -> frozenset[str]:
    """The host names of a comma-separated setting, normalized (``*`` allows any)."""
    return frozenset(_normalize_name(part) for part in value.split(",") if part.strip())


def _normalize_name(name: str) -> str:
    name = name.strip().lower().rstrip(".")
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def split_host(authority: str) -> tuple[str, int | None] | None:
    """The name and port of a ``Host`` value (``[::1]:8000`` → ``("::1", 8000)``), or None
    when it is not a host name with an optional port."""
    authority = authority.strip().lower()
    if not authority:
        return None
    if authority.startswith("["):
        name, bracket, rest = authority[1:].partition("]")
        if not bracket:
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        port_text = rest.removeprefix(":") if rest.startswith(":") else None
        if rest and port_text is None:
            return None
    else:
        name, colon, port_text_or_empty = authority.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is not None and not (port_text.isdigit() and int(port_text) < 65536):
        return None
    name = name.rstrip(".")
    if not name:
        return None
    return name, int(port_text) if port_text is not None else None


def same_origin(origin: str, host: str) -> bool:
    """Whether the ``Origin`` value names the host and port the request was sent to.

    A browser leaves the default port of its scheme out of ``Host``, so a missing port is the
    origin scheme's default (which also holds behind a proxy that ends TLS).
    """
    parts = urlsplit(origin)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file) or no origin a browser sends
    origin_host = split_host(parts.netloc)
    request_host = split_host(host)
    if origin_host is None or request_host is None:
        return False
    origin_port = origin_host[1] or _DEFAULT_PORTS[parts.scheme]
    request_port = request_host[1] or _DEFAULT_PORTS[parts.scheme]
    return (origin_host[0], origin_port) == (request_host[0], request_port)


class BrowserGuard:
    """The refusals of requests a browser was made to send: a 400 to a ``Host`` that is not
    allowed and a 403 to a cross-site write (problem+json naming the header and the setting).

    Run by the service's edge middleware before the key is looked at. The ``Host`` values seen
    are remembered with their verdict (a bounded table), so a request costs a dict lookup.
    """

    HOST_TABLE_SIZE = 256
    """How many distinct ``Host`` values are remembered (the table starts over when full)."""

    def __init__(self, *, allowed_hosts: frozenset[str]) -> None:
        self.allowed_hosts = allowed_hosts
        self.any_host = "*" in allowed_hosts
        self._host_allowed: dict[str, bool] = {}

    def refusal(
        self, scope: Scope, *, host: str, origin: str | None, sec_fetch_site: str | None
    ) -> Response | None:
        """The problem response refusing the request, or None if it may go on."""
        refusal = self._host_refusal(scope, host) or self._origin_refusal(
            scope, host, origin, sec_fetch_site
        )
        if refusal is None:
            return None
        status, slug, detail = refusal
        return problem_response(status=status, detail=detail, instance=scope["path"], slug=slug)

    def _host_is_allowed(self, host: str) -> bool:
        allowed = self._host_allowed.get(host)
        if allowed is None:
            parsed = split_host(host)
            allowed = parsed is not None and parsed[0] in self.allowed_hosts
            if len(self._host_allowed) >= self.HOST_TABLE_SIZE:
                self._host_allowed.clear()
            self._host_allowed[host] = allowed
        return allowed

    def _host_refusal(self, scope: Scope, host: str) -> tuple[int, str, str] | None:
        if self.any_host or scope["path"] in PROBE_PATHS or self._host_is_allowed(host):
            return None
        shown = repr(host[:100]) if host else "(none)"
        return (
            400,
            "host-not-allowed",
            f"the Host header {shown} is not a name this server answers to; allowed: "
            f"{', '.join(sorted(self.allowed_hosts))} (MIXREG_ALLOWED_HOSTS)",
        )

    @staticmethod
    def _origin_refusal(
        scope: Scope, host: str, origin: str | None, sec_fetch_site: str | None
    ) -> tuple[int, str, str] | None:
        if scope["method"] in _SAFE_METHODS:
            return None
        if origin is not None and not same_origin(origin, host):
            return (
                403,
                "cross-origin",
                f"a request from the web page at {origin[:100]!r} may not change anything "
                f"here: only pages this server serves may send writes from a browser",
            )
        if sec_fetch_site is not None and sec_fetch_site.lower() == "cross-site":
            return (
                403,
                "cross-origin",
                "a request a browser sends from another site (Sec-Fetch-Site: cross-site) may "
                "not change anything here",
            )
        return None
