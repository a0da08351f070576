"""``mixreg serve`` and ``mixreg db upgrade|downgrade|current``: run and migrate the server."""

from __future__ import annotations

import argparse

import uvicorn

from models_store import migrate
from service.config import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=args.host or settings.host,
        port=args.port or settings.port,
        log_level=args.log_level,
    )
    return 0


def _upgrade(args: argparse.Namespace, settings: Settings) -> int:
    migrate.upgrade(settings.database_url, args.revision)
    print(f"database at revision {migrate.current_revision(settings.database_url)}")
    return 0


def _downgrade(args: argparse.Namespace, settings: Settings) -> int:
    migrate.downgrade(settings.database_url, args.revision)
    print(f"database at revision {migrate.current_revision(settings.database_url)}")
    return 0


def _current(args: argparse.Namespace, settings: Settings) -> int:
    revision = migrate.current_revision(settings.database_url)
    head = migrate.head_revision()
    state = "at head" if revision == head else f"head is {head}"
    print(f"{revision} ({state})")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and ``db`` to the ``mixreg`` command."""
    serve = commands.add_parser("serve", help="serve the HTTP API with the embedded worker")
    serve.add_argument("--host", help="interface to bind (default: MIXREG_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: MIXREG_PORT or 8000)")
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.set_defaults(handler=_serve)

    database = commands.add_parser("db", help="manage the database schema (MIXREG_DATABASE_URL)")
    db_commands = database.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="upgrade to a revision (default: head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(handler=_upgrade)
    downgrade = db_commands.add_parser("downgrade", help="downgrade to a revision (default: base)")
    downgrade.add_argument("revision", nargs="?", default="base")
    downgrade.set_defaults(handler=_downgrade)
    current = db_commands.add_parser("current", help="show the database's revision")
    current.set_defaults(handler=_current)
