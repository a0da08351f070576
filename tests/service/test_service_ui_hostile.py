"""The web page against hostile browsers and names: forged form tokens of any alphabet, names
that look like TeX, and framing by another site."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.auth.keys import KeyRing, add_key, key_id, new_key
from service.auth.sessions import session_of
from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL


@pytest.fixture
def keyed_client(sqlite_url: str, tmp_path: Path):
    """The app with API keys on, and a read key."""
    key_file = tmp_path / "keys.json"
    read = new_key(scope="read")
    add_key(key_file, read.record)
    settings = Settings(database_url=sqlite_url, embedded_worker=False, api_keys_file=key_file)
    with TestClient(
        create_app(settings), raise_server_exceptions=False, base_url=LOCAL_URL
    ) as client:
        yield client, read.key


def _csrf(client: TestClient) -> str:
    form = client.get("/ui/sign-in")
    assert form.status_code == 200
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert match is not None
    return match.group(1)


@pytest.mark.parametrize("token", ["é" * 43, "令牌", "\u0000x"])
def test_a_sign_in_form_token_beyond_ascii_is_refused(keyed_client, token):
    client, key = keyed_client
    _csrf(client)
    refused = client.post("/ui/sign-in", data={"api_key": key, "csrf": token})
    assert refused.status_code == 403, refused.text
    assert "mixreg_session" not in refused.cookies
    # The same client still signs in with its real token.
    signed_in = client.post(
        "/ui/sign-in", data={"api_key": key, "csrf": _csrf(client)}, follow_redirects=False
    )
    assert signed_in.status_code == 303


def test_a_sign_in_cookie_token_beyond_ascii_is_refused(keyed_client):
    client, key = keyed_client
    token = "ü" * 10
    response = client.post(
        "/ui/sign-in",
        content=f"api_key={key}&csrf=%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC%C3%BC",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"mixreg_csrf={token}".encode(),  # type: ignore[dict-item]
        },
    )
    assert response.status_code == 403, response.text


def test_a_sign_out_token_beyond_ascii_is_refused(keyed_client):
    client, key = keyed_client
    signed_in = client.post(
        "/ui/sign-in", data={"api_key": key, "csrf": _csrf(client)}, follow_redirects=False
    )
    assert signed_in.status_code == 303
    refused = client.post("/ui/sign-out", data={"token": "ß" * 43}, follow_redirects=False)
    assert refused.status_code == 403, refused.text
    assert client.get("/ui").status_code == 200  # still signed in


def test_a_session_cookie_beyond_ascii_is_no_session(keyed_client):
    client, key = keyed_client
    # Header bytes are read as Latin-1: 0xAA is "ª", a letter, so the forged MAC has the
    # cookie's shape in every way but its alphabet.
    forged = b"mixreg_session=" + str(key_id(key)).encode() + b".9999999999." + b"\xaa" * 43
    response = client.get("/ui", headers={"Cookie": forged}, follow_redirects=False)  # type: ignore[dict-item]
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/ui/sign-in"


def test_a_session_mac_beyond_ascii_is_no_session(tmp_path: Path):
    # The cookie parser drops such cookies before the middleware sees them; the session check
    # refuses them on its own too, rather than raise in hmac.compare_digest.
    read = new_key(scope="read")
    add_key(tmp_path / "keys.json", read.record)
    keyring = KeyRing(file=tmp_path / "keys.json", environment=None)
    assert session_of(f"{read.record.id}.9999999999.{'ª' * 43}", keyring) is None


@pytest.mark.parametrize("name", ["$\\nosuchcommand{x}$", "$x^{$", "price in $", "\\frac{a}{b}$$"])
@pytest.mark.parametrize("n_features", [1, 2])
def test_a_picture_draws_names_as_they_are_written(client, run_queued_jobs, name, n_features):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, n_features))
    y = np.where(rng.integers(0, 2, 40), X.sum(axis=1), -X.sum(axis=1))
    names = [name, *(f"{name}{index}" for index in range(1, n_features))]
    dataset = client.post(
        "/datasets", json={"X": X.tolist(), "y": y.tolist(), "feature_names": names}
    )
    assert dataset.status_code == 201, dataset.text
    fit = client.post(
        "/fit",
        json={"dataset_id": dataset.json()["id"], "k": 2, "algorithm": "am-classic", "name": name},
    )
    assert fit.status_code == 202, fit.text
    assert run_queued_jobs() == ["succeeded"]
    model_url = client.get(fit.json()["url"]).json()["model_url"]
    picture = client.get(f"{model_url}/plot.png")
    assert picture.status_code == 200, picture.text
    assert picture.content.startswith(b"\x89PNG")


def _assert_not_frameable(response) -> None:
    policy = response.headers["content-security-policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["frame-ancestors"] == "'none'"
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'none'"
    assert response.headers["x-frame-options"] == "DENY"


def test_every_answer_of_the_page_forbids_framing(client, data):
    X, y = data
    assert (
        client.post("/fit", json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2}).status_code
        == 202
    )
    page = client.get("/ui")
    assert page.status_code == 200
    _assert_not_frameable(page)
    # The policy allows no inline script or style: the page has none (a queued job's progress
    # bar included).
    assert "<progress" in page.text
    assert "<script" not in page.text and "style=" not in page.text
    _assert_not_frameable(client.get("/ui/static/ui.css"))
    _assert_not_frameable(client.get("/ui/models/nope"))


def test_the_sign_in_page_and_its_refusals_forbid_framing(keyed_client):
    client, _ = keyed_client
    _assert_not_frameable(client.get("/ui/sign-in"))
    _assert_not_frameable(client.get("/ui", follow_redirects=False))
    _assert_not_frameable(client.post("/ui/sign-out", data={"token": "x"}))
