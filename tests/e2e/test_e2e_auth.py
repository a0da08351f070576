"""API keys over real HTTP: keys made with the ``mixreg keys`` console script, a server that
requires them, and every route of the app walked without a key, with a wrong one and with a
read key; a key in the URL, a revoked key, and the limit of unfinished jobs per key."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import BaseRoute, Mount

from mixreg_client import Client, MixregError
from service.auth import policy
from service.config import Settings
from service.main import create_app
from tests.e2e.conftest import REPO, Server, mixture_data

pytestmark = pytest.mark.e2e

MIXREG = str(REPO / ".venv" / "bin" / "mixreg")
ANY_ID = "0" * 32


def mixreg_keys(key_file: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run ``mixreg keys ...`` (the console script) on ``key_file``."""
    environment = {**os.environ, "MIXREG_API_KEYS_FILE": str(key_file)}
    environment.pop("MIXREG_API_KEYS", None)
    return subprocess.run(
        [MIXREG, "keys", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def create_key(key_file: Path, scope: str) -> str:
    result = mixreg_keys(key_file, "create", "--scope", scope, "--name", f"{scope} test")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"mixreg_[0-9a-f]{12}_[A-Za-z0-9_-]{43}\n", result.stdout)
    return result.stdout.strip()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def start_server(tmp_path: Path, **settings: str) -> Server:
    server = Server(
        database_url=f"sqlite:///{tmp_path / 'mixreg.db'}",
        log_path=tmp_path / "server.log",
        settings=settings,
    )
    server.start()
    return server


class Keyed:
    """A server requiring keys, with a write key and a read key."""

    def __init__(self, server: Server, key_file: Path, write: str, read: str) -> None:
        self.server, self.key_file, self.write, self.read = server, key_file, write, read


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    tmp_path = tmp_path_factory.mktemp("keyed")
    key_file = tmp_path / "api-keys.json"
    write, read = create_key(key_file, "write"), create_key(key_file, "read")
    server = start_server(tmp_path, MIXREG_API_KEYS_FILE=str(key_file))
    yield Keyed(server, key_file, write, read)
    server.stop()
    server.client.close()


def concrete(path: str) -> str:
    """A route's path with every parameter replaced by an id."""
    return re.sub(r"\{[^}]+\}", ANY_ID, path)


def every_endpoint(routes: list[BaseRoute]) -> Iterator[tuple[str, str]]:
    """(method, path) of every route of the app: its own, its routers' and its mounts."""
    for route in iter_route_contexts(routes):
        if isinstance(route.original_route, Mount):
            yield "GET", concrete(route.path or "") + "/anything"
        elif route.path is not None:
            for method in sorted(route.methods or {"GET"}):
                yield method, concrete(route.path)


@pytest.fixture(scope="module")
def endpoints(keyed: Keyed) -> list[tuple[str, str]]:
    """Every endpoint of the app the server runs (built the same way, not started)."""
    settings = Settings(database_url="sqlite://", api_keys_file=keyed.key_file)
    found = sorted(set(every_endpoint(list(create_app(settings).routes))))
    assert ("POST", "/fit") in found and ("DELETE", f"/models/{ANY_ID}") in found
    return found


def assert_refused(response, status: int, error: str | None) -> dict:
    assert response.status_code == status, (response.request.url, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="mixreg"')
    if error is not None:
        assert f'error="{error}"' in challenge
    body = response.json()
    assert body["status"] == status
    return body


def test_every_route_but_the_open_ones_needs_a_key(keyed: Keyed, endpoints):
    checked = 0
    for method, path in endpoints:
        response = keyed.server.request(method, path)
        if policy.is_open(path, metrics_open=False) or policy.is_public_asset(method, path):
            assert response.status_code != 401, (method, path)
            continue
        if policy.is_page(method, path):
            # A page a browser opens: sent to the sign-in form rather than refused.
            assert response.status_code == 303, (method, path)
            assert response.headers["location"] == policy.SIGN_IN_PATH
            continue
        body = assert_refused(response, 401, None)
        assert body["detail"] == (
            "this endpoint needs an API key: send the header Authorization: Bearer <key>"
        )
        checked += 1
    assert checked >= 10
    assert keyed.server.request("GET", "/no/such/route").status_code == 401
    assert keyed.server.request("GET", "/healthz").status_code == 200
    assert keyed.server.request("GET", "/readyz").status_code == 200
    assert keyed.server.request("GET", "/openapi.json").status_code == 200
    assert keyed.server.request("GET", "/docs").status_code == 200
    assert keyed.server.request("GET", "/metrics").status_code == 401


def test_a_wrong_or_malformed_key_is_401(keyed: Keyed):
    wrong_secret = keyed.write[:-4] + ("AAAA" if not keyed.write.endswith("AAAA") else "BBBB")
    unknown = "mixreg_0123456789ab_" + "x" * 43
    for credentials in (wrong_secret, unknown, "let-me-in", keyed.write + "x"):
        response = keyed.server.request("GET", "/jobs", headers=bearer(credentials))
        body = assert_refused(response, 401, "invalid_token")
        assert body["detail"] == "the API key is not valid"
    for header in (f"Basic {keyed.write}", "Bearer", keyed.write, f"Token {keyed.write}"):
        response = keyed.server.request("GET", "/jobs", headers={"Authorization": header})
        assert_refused(response, 401, "invalid_request")


def test_a_read_key_reads_and_predicts_but_writes_nothing(keyed: Keyed, endpoints):
    writes = set()
    for method, path in endpoints:
        if policy.is_open(path, metrics_open=False) or policy.is_public_asset(method, path):
            continue
        response = keyed.server.request(method, path, headers=bearer(keyed.read))
        if policy.required_scope(method, path) == "write":
            body = assert_refused(response, 403, "insufficient_scope")
            key_id = keyed.read.split("_")[1]
            assert body["detail"] == (
                f"API key {key_id} has the scope 'read'; {method} {path} needs a key with the "
                f"scope 'write'"
            )
            assert 'scope="write"' in response.headers["www-authenticate"]
            writes.add((method, path))
        else:
            assert response.status_code not in (401, 403), (method, path, response.text)
    assert {
        ("POST", "/fit"),
        ("POST", "/datasets"),
        ("POST", f"/jobs/{ANY_ID}/cancel"),
        ("DELETE", f"/models/{ANY_ID}"),
    } <= writes

    # The real thing: a write key uploads and fits, a read key predicts and reads.
    X, y = mixture_data(60)
    server, write, read = keyed.server, bearer(keyed.write), bearer(keyed.read)
    uploaded = server.request(
        "POST", "/datasets", json={"X": X.tolist(), "y": y.tolist()}, headers=write
    )
    assert uploaded.status_code == 201, uploaded.text
    submitted = server.request(
        "POST", "/fit", json={"dataset_id": uploaded.json()["id"], "k": 2}, headers=write
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    server.client.headers.update(read)
    try:
        job = server.wait_for_job(job_id)
    finally:
        del server.client.headers["Authorization"]
    assert job["status"] == "succeeded"
    predicted = server.request(
        "POST", f"/models/{job['model_id']}/predict", json={"X": X[:2].tolist()}, headers=read
    )
    assert predicted.status_code == 200, predicted.text
    assert len(predicted.json()["predictions"]) == 2
    deleted = server.request("DELETE", f"/models/{job['model_id']}", headers=read)
    assert_refused(deleted, 403, "insufficient_scope")
    assert server.request("GET", f"/models/{job['model_id']}", headers=read).status_code == 200


def test_a_key_in_the_query_string_is_refused_even_with_a_good_header(keyed: Keyed):
    for query in (
        {"access_token": keyed.read},
        {"api_key": "anything"},
        {"status": "queued", "k": keyed.read},
    ):
        response = keyed.server.request("GET", "/jobs", params=query, headers=bearer(keyed.read))
        body = assert_refused(response, 400, "invalid_request")
        assert body["detail"].startswith("API keys are not accepted in the query string")
        assert keyed.read not in response.text


def test_a_revoked_key_is_refused_at_once_without_a_restart(keyed: Keyed):
    key = create_key(keyed.key_file, "write")
    key_id = key.split("_")[1]
    assert keyed.server.request("GET", "/jobs", headers=bearer(key)).status_code == 200
    revoked = mixreg_keys(keyed.key_file, "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    body = assert_refused(
        keyed.server.request("GET", "/jobs", headers=bearer(key)), 401, "invalid_token"
    )
    assert body["detail"] == f"API key {key_id} was revoked; ask for a new key"
    listed = mixreg_keys(keyed.key_file, "list").stdout
    assert re.search(rf"^{key_id}\s+write\s+revoked ", listed, re.MULTILINE), listed
    read_id = keyed.read.split("_")[1]
    assert re.search(rf"^{read_id}\s+read\s+active\s", listed, re.MULTILINE), listed
    assert keyed.server.request("GET", "/jobs", headers=bearer(keyed.read)).status_code == 200


def test_keys_never_reach_the_log(keyed: Keyed):
    log = keyed.server.log()
    for key in (keyed.write, keyed.read):
        assert key not in log
        assert key.split("_", 2)[2] not in log
    assert "API keys are required: 2 active" in log


def test_without_keys_the_server_will_not_bind_the_network(tmp_path: Path):
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("MIXREG_")
    }
    environment["MIXREG_DATABASE_URL"] = f"sqlite:///{tmp_path / 'mixreg.db'}"
    refused = subprocess.run(
        [MIXREG, "serve", "--host", "0.0.0.0", "--port", "1"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in refused.stderr
    assert "MIXREG_ALLOW_UNAUTHENTICATED=true" in refused.stderr
    assert not (tmp_path / "mixreg.db").exists()


def test_the_client_says_where_its_key_comes_from(keyed: Keyed, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MIXREG_API_KEY", raising=False)
    with Client(keyed.server.base_url) as client, pytest.raises(MixregError) as missing:
        client.list_models()
    assert missing.value.status == 401
    assert missing.value.detail == (
        "this server needs an API key: set MIXREG_API_KEY or pass api_key="
    )
    wrong_key = "mixreg_000000000000_wrong"
    with (
        Client(keyed.server.base_url, api_key=wrong_key) as client,
        pytest.raises(MixregError) as wrong,
    ):
        client.list_models()
    assert wrong.value.detail.endswith("(the key comes from api_key= or MIXREG_API_KEY)")
    monkeypatch.setenv("MIXREG_API_KEY", keyed.read)
    with Client(keyed.server.base_url) as client:
        assert isinstance(client.list_models(), list)


def test_the_command_line_says_which_flag_takes_the_key(keyed: Keyed):
    environment = {name: value for name, value in os.environ.items() if name != "MIXREG_API_KEY"}
    result = subprocess.run(
        [MIXREG, "models", "--url", keyed.server.base_url],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "mixreg: this server needs an API key: set MIXREG_API_KEY or give --api-key "
        "(401 Unauthorized)"
    )
