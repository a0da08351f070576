"""Sign-in behind a proxy that ends TLS, on a real ``mixreg serve``: the scheme a trusted
proxy forwards (``X-Forwarded-Proto: https`` from an address in ``--forwarded-allow-ips``) is
the request's, so the browser's https ``Origin`` is accepted and the cookies are ``Secure``;
the same header from any other address is ignored."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server
from .test_e2e_ui_sign_in import MIXREG, create_key

pytestmark = pytest.mark.e2e

PROXY = "127.0.0.2"
"""The proxy's address: the only one trusted to forward the scheme."""
STRANGER = "127.0.0.3"
NAME = "mixreg.example"
"""The name the proxy serves the page under (https, default port)."""


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    folder = tmp_path_factory.mktemp("ui-proxy")
    key_file = folder / "api-keys.json"
    read = create_key(key_file, "read")
    server = Server(
        database_url=f"sqlite:///{folder / 'mixreg.db'}",
        log_path=folder / "server.log",
        settings={
            "MIXREG_API_KEYS_FILE": str(key_file),
            "MIXREG_ALLOWED_HOSTS": f"{NAME},127.0.0.1",
        },
        command=[
            str(MIXREG),
            "serve",
            "--port",
            "{port}",
            "--forwarded-allow-ips",
            PROXY,
        ],
    )
    server.start()
    yield server, read
    server.stop()
    server.client.close()


def _client(server: Server, source: str) -> httpx.Client:
    """A client connecting from ``source`` as the proxy would, naming the public host."""
    return httpx.Client(
        base_url=server.base_url,
        transport=httpx.HTTPTransport(local_address=source),
        headers={"Host": NAME, "X-Forwarded-Proto": "https"},
        timeout=30,
    )


def _set_cookie(response: httpx.Response, name: str) -> str:
    lines = [line for line in response.headers.get_list("set-cookie") if line.startswith(name)]
    assert len(lines) == 1, response.headers
    return lines[0]


def _sign_in(client: httpx.Client, key: str, origin: str) -> tuple[httpx.Response, str]:
    """The answer to a sign-in sent from ``origin``, and the form's CSRF cookie as set."""
    # Cookies by hand: a Secure cookie is one httpx would not send back over plain http.
    form = client.get("/ui/sign-in")
    assert form.status_code == 200, form.text
    csrf_cookie = _set_cookie(form, "mixreg_csrf=")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    answer = client.post(
        "/ui/sign-in",
        data={"api_key": key, "csrf": csrf.group(1)},
        headers={"Origin": origin, "Cookie": csrf_cookie.split(";")[0]},
        follow_redirects=False,
    )
    return answer, csrf_cookie


def test_a_browser_signs_in_through_the_trusted_tls_proxy(proxied):
    server, key = proxied
    with _client(server, PROXY) as client:
        answer, csrf_cookie = _sign_in(client, key, f"https://{NAME}")
    assert "secure" in csrf_cookie.lower()
    assert answer.status_code == 303, answer.text
    session = _set_cookie(answer, "mixreg_session=")
    attributes = [part.strip().lower() for part in session.split(";")]
    assert "secure" in attributes and "httponly" in attributes and "samesite=strict" in attributes
    with _client(server, PROXY) as client:
        page = client.get("/ui", headers={"Cookie": session.split(";")[0]})
    assert page.status_code == 200 and "sign out" in page.text


def test_the_forwarded_scheme_of_an_untrusted_address_is_ignored(proxied):
    server, key = proxied
    with _client(server, STRANGER) as client:
        answer, csrf_cookie = _sign_in(client, key, f"https://{NAME}")
        # Its request is plain http: an https page's form is another origin, and no cookie
        # is marked Secure.
        assert "secure" not in csrf_cookie.lower()
        assert answer.status_code == 403
        assert not any(
            line.startswith("mixreg_session=") for line in answer.headers.get_list("set-cookie")
        )
        answer, _ = _sign_in(client, key, f"http://{NAME}")
    assert answer.status_code == 303
    assert "secure" not in _set_cookie(answer, "mixreg_session=").lower()
