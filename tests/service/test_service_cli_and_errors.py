"""The `mixreg` command and the last-resort error handler."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from mixreg_client.cli import build_parser, main
from models_store import migrate
from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL


def test_db_commands_migrate_the_configured_database(monkeypatch, sqlite_url, capsys):
    monkeypatch.setenv("MIXREG_DATABASE_URL", sqlite_url)
    head = migrate.head_revision()
    assert main(["db", "upgrade"]) == 0
    assert capsys.readouterr().out == f"database at revision {head}\n"
    assert main(["db", "current"]) == 0
    assert capsys.readouterr().out == f"{head} (at head)\n"
    assert main(["db", "downgrade", "base", "--yes"]) == 0
    assert capsys.readouterr().out == "database at revision None\n"
    assert migrate.current_revision(sqlite_url) is None


def test_serve_options():
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--port", "9000"])
    assert (args.host, args.port) == ("0.0.0.0", 9000)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["db"])


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MIXREG_WORKER_CONCURRENCY", "5")
    monkeypatch.setenv("MIXREG_EMBEDDED_WORKER", "false")
    settings = Settings()
    assert (settings.worker_concurrency, settings.embedded_worker) == (5, False)
    assert Settings.model_fields["database_url"].default == "sqlite:///./mixreg.db"
    assert Settings.model_fields["max_body_bytes"].default == 64 * 1024 * 1024


def test_an_unexpected_error_is_a_500_problem_without_internals(sqlite_url, caplog):
    app = create_app(Settings(database_url=sqlite_url, embedded_worker=False))

    @app.get("/explode")
    def explode() -> None:
        raise RuntimeError("secret internal state")

    with (
        TestClient(app, raise_server_exceptions=False, base_url=LOCAL_URL) as client,
        caplog.at_level(logging.ERROR, logger="service.api.errors"),
    ):
        response = client.get("/explode")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    detail = response.json()["detail"]
    assert detail == "the server failed to handle the request; see the server log"
    assert "secret" not in response.text
    assert "unhandled error on GET /explode" in caplog.text
