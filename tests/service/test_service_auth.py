"""API keys: their format, hashes, storage and constant-time check; who may call what; the
middleware in front of the app (clients off this machine, the OpenAPI document)."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from service.auth import keys, policy
from service.auth.keys import (
    InvalidKeyError,
    KeyRing,
    KeyStoreError,
    RevokedKeyError,
    add_key,
    environment_entry,
    new_key,
    parse_environment_entries,
    read_key_file,
    revoke_key,
)
from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL


def test_a_new_key_is_random_and_only_its_hash_is_kept():
    first, second = new_key(scope="read"), new_key(scope="read")
    assert first.key != second.key
    assert first.key.startswith(f"mixreg_{first.record.id}_")
    assert len(first.key) == len("mixreg_") + 12 + 1 + 43
    assert first.record.key_hash.startswith("sha256:")
    assert first.key not in repr(first.record)
    assert keys.key_id(first.key) == first.record.id


def test_the_key_check_compares_hashes_with_hmac_compare_digest(monkeypatch):
    made = new_key(scope="write")
    ring = KeyRing(file=None, environment=environment_entry(made.record))
    compared: list[tuple[bytes, bytes]] = []
    real_compare = keys.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    assert ring.authenticate(made.key).id == made.record.id
    wrong_secret = made.key[:-1] + ("A" if made.key[-1] != "A" else "B")
    unknown_id = new_key(scope="write").key
    for presented in (wrong_secret, unknown_id, "not-a-key"):
        with pytest.raises(InvalidKeyError):
            ring.authenticate(presented)
    # Every check, the unknown ids included, went through the constant-time comparison.
    assert len(compared) == 4
    assert all(stored.startswith(b"sha256:") for _, stored in compared)


def test_a_revoked_key_is_refused_only_with_its_right_secret(tmp_path):
    path = tmp_path / "keys.json"
    made = new_key(scope="read")
    add_key(path, made.record)
    ring = KeyRing(file=path, environment=None)
    assert ring.authenticate(made.key).id == made.record.id
    revoke_key(path, made.record.id)
    with pytest.raises(RevokedKeyError):
        ring.authenticate(made.key)
    with pytest.raises(InvalidKeyError):
        ring.authenticate(made.key[:-2] + "xx")


def test_the_key_file_is_private_and_read_again_when_it_changes(tmp_path):
    path = tmp_path / "keys.json"
    ring = KeyRing(file=path, environment=None)
    assert ring.enabled and ring.keys == []  # no file yet: keys required, none exists
    made = new_key(scope="write", name="ci")
    add_key(path, made.record)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert made.key not in path.read_text()
    assert [key.id for key in ring.keys] == [made.record.id]
    assert read_key_file(path)[0].name == "ci"


def test_a_damaged_key_file_stops_the_start_and_a_later_damage_keeps_the_last_keys(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"id": "nothex", "scope": "read"}]}')
    with pytest.raises(KeyStoreError, match="is not a mixreg key file"):
        KeyRing(file=path, environment=None)
    made = new_key(scope="read")
    path.unlink()
    add_key(path, made.record)
    ring = KeyRing(file=path, environment=None)
    path.write_text("{half a file")
    assert ring.authenticate(made.key).id == made.record.id


def test_environment_entries(tmp_path):
    read, write = new_key(scope="read"), new_key(scope="write")
    text = f" {environment_entry(read.record)},\n{environment_entry(write.record)} "
    parsed = parse_environment_entries(text)
    assert [(key.id, key.scope, key.source) for key in parsed] == [
        (read.record.id, "read", "environment"),
        (write.record.id, "write", "environment"),
    ]
    with pytest.raises(KeyStoreError, match="entry 2 is not of the form"):
        parse_environment_entries(f"{environment_entry(read.record)},{read.key}")
    with pytest.raises(KeyStoreError, match="twice"):
        parse_environment_entries(f"{environment_entry(read.record)} " * 2)


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/jobs", "read"),
        ("HEAD", "/models/abc", "read"),
        ("POST", "/predict", "read"),
        ("POST", "/models/abc/predict", "read"),
        ("POST", "/v2/models/abc/infer", "read"),
        ("POST", "/v2/models/abc/versions/1/infer", "read"),
        ("POST", "/models/reco@production/predict", "read"),
        ("POST", "/models/reco/versions/3/predict", "read"),
        ("PUT", "/registered-models/reco/aliases/production", "write"),
        ("DELETE", "/registered-models/reco/aliases/production", "write"),
        ("POST", "/fit", "write"),
        ("POST", "/datasets", "write"),
        ("POST", "/jobs/abc/cancel", "write"),
        ("DELETE", "/models/abc", "write"),
        ("POST", "/models/abc/predict/more", "write"),
        ("PUT", "/anything/new", "write"),
    ],
)
def test_the_scope_each_request_needs(method, path, scope):
    assert policy.required_scope(method, path) == scope


def test_open_paths():
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/openapi.json"):
        assert policy.is_open(path, metrics_open=False)
    assert not policy.is_open("/metrics", metrics_open=False)
    assert policy.is_open("/metrics", metrics_open=True)
    assert not policy.is_open("/healthz/../jobs", metrics_open=True)


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("::1", False),
        ("localhost", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("example.org", True),
    ],
)
def test_binding_beyond_loopback_without_keys_is_refused(host, refused):
    refusal = policy.bind_refusal(host, keys_configured=False, allow_unauthenticated=False)
    assert (refusal is not None) == refused
    assert policy.bind_refusal(host, keys_configured=True, allow_unauthenticated=False) is None
    assert policy.bind_refusal(host, keys_configured=False, allow_unauthenticated=True) is None


@pytest.fixture
def keyless_settings(sqlite_url):
    return Settings(database_url=sqlite_url, embedded_worker=False)


def test_without_keys_a_client_off_this_machine_is_refused(keyless_settings):
    app = create_app(keyless_settings)
    with TestClient(app, client=("203.0.113.7", 50000), base_url=LOCAL_URL) as remote:
        response = remote.get("/jobs")
        assert response.status_code == 403
        assert response.headers["content-type"] == "application/problem+json"
        assert "MIXREG_ALLOW_UNAUTHENTICATED" in response.json()["detail"]
        assert remote.get("/healthz").status_code == 200  # probes stay open
    for local in (("127.0.0.1", 50000), ("::1", 50000), ("::ffff:127.0.0.1", 50000)):
        with TestClient(app, client=local, base_url=LOCAL_URL) as client:
            assert client.get("/jobs").status_code == 200


def test_without_keys_anyone_is_served_when_explicitly_allowed(keyless_settings):
    settings = keyless_settings.model_copy(update={"allow_unauthenticated": True})
    with TestClient(
        create_app(settings), client=("203.0.113.7", 50000), base_url=LOCAL_URL
    ) as remote:
        assert remote.get("/jobs").status_code == 200


def test_the_openapi_document_shows_the_bearer_scheme_and_each_scope(sqlite_url, tmp_path):
    settings = Settings(
        database_url=sqlite_url, embedded_worker=False, api_keys_file=tmp_path / "keys.json"
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        document = client.get("/openapi.json").json()
        # The docs page and its own assets work before the reader has a key.
        page = client.get("/docs")
        assert page.status_code == 200
        assets = re.findall(r'(?:href|src)="(/[^"]+\.(?:css|js))"', page.text)
        assert assets
        for asset in assets:
            assert client.get(asset).status_code == 200, asset
        assert client.get("/redoc").status_code == 200
        assert client.get("/jobs").status_code == 401
    assert document["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["apiKey"]["description"],
    }
    fit = document["paths"]["/fit"]["post"]
    assert fit["security"] == [{"apiKey": []}]
    assert "scope `write`" in fit["description"]
    assert {"400", "401", "403", "429"} <= fit["responses"].keys()
    assert "WWW-Authenticate" in fit["responses"]["401"]["headers"]
    assert "scope `read`" in document["paths"]["/predict"]["post"]["description"]
    assert document["paths"]["/healthz"]["get"]["security"] == []


def test_without_keys_the_openapi_document_declares_no_scheme(keyless_settings):
    with TestClient(create_app(keyless_settings), base_url=LOCAL_URL) as client:
        document = client.get("/openapi.json").json()
    assert "securitySchemes" not in document.get("components", {})
    assert "security" not in document["paths"]["/fit"]["post"]
    assert json.dumps(document).count("apiKey") == 0


@pytest.mark.parametrize("with_keys", [False, True])
def test_every_websocket_connection_is_refused_by_the_middleware(sqlite_url, with_keys):
    # The service has no websocket endpoints; the router would close with 1000 (normal), the
    # middleware refuses before routing with 1008 (policy violation), keys or not.
    made = new_key(scope="write")
    settings = Settings(
        database_url=sqlite_url,
        embedded_worker=False,
        api_keys=environment_entry(made.record) if with_keys else None,
    )
    headers = {"Authorization": f"Bearer {made.key}"} if with_keys else {}
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        for path in ("/jobs", "/healthz", "/nowhere"):
            with (
                pytest.raises(WebSocketDisconnect) as refused,
                client.websocket_connect(path, headers=headers),
            ):
                pass
            assert refused.value.code == 1008


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "evil.example"}, 400),
        ({"Host": "localhost:8000", "Origin": "http://localhost:8000"}, 201),
        # Behind a proxy that ends TLS: the browser's origin and Host name the same server.
        ({"Host": "localhost", "Origin": "https://localhost"}, 201),
        ({"Host": "localhost", "Origin": "https://localhost:8443"}, 403),
        ({"Host": "[::1]:8000", "Origin": "http://[::1]:8000"}, 201),
        ({"Host": "localhost:8000", "Origin": "http://127.0.0.1:8000"}, 403),
        ({"Host": "localhost:8000", "Sec-Fetch-Site": "same-site"}, 201),
        ({"Host": "localhost:8000", "Sec-Fetch-Site": "cross-site"}, 403),
    ],
)
def test_host_and_origin_of_a_browser_write(keyless_settings, headers, status):
    with TestClient(create_app(keyless_settings), base_url=LOCAL_URL) as client:
        response = client.post(
            "/datasets", json={"X": [[1.0], [2.0]], "y": [1.0, 2.0]}, headers=headers
        )
    assert response.status_code == status, response.text


def test_any_host_is_answered_when_the_setting_says_so(keyless_settings):
    settings = keyless_settings.model_copy(update={"allowed_hosts": "*"})
    with TestClient(create_app(settings), base_url="http://mixreg.example.com") as client:
        assert client.get("/jobs").status_code == 200
