"""``mixreg serve`` and ``mixreg db upgrade|downgrade|current``: run and migrate the server."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from models_store import migrate
from service.auth.policy import bind_refusal
from service.cli.arguments import positive_int, with_settings
from service.config import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    host = args.host or settings.host
    refusal = bind_refusal(
        host,
        keys_configured=settings.api_keys_file is not None or settings.api_keys is not None,
        allow_unauthenticated=settings.allow_unauthenticated,
    )
    if refusal is not None:
        print(f"mixreg serve: {refusal}", file=sys.stderr)
        return 2
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=host,
        port=args.port or settings.port,
        log_level=args.log_level,
        # The scheme and client address a trusted proxy forwards become the request's own
        # (uvicorn's proxy headers), so a page served over the proxy's TLS is an https page.
        proxy_headers=True,
        forwarded_allow_ips=args.forwarded_allow_ips or settings.forwarded_allow_ips,
        # Each API process is a full app (with its embedded worker in embedded mode); they
        # share the database, and a model deleted through one stops being served by the others
        # within MIXREG_MODEL_CACHE_CHECK_INTERVAL_S or so.
        workers=args.workers,
    )
    return 0


def _upgrade(args: argparse.Namespace, settings: Settings) -> int:
    migrate.upgrade(settings.database_url, args.revision)
    print(f"database at revision {migrate.current_revision(settings.database_url)}")
    return 0


def _downgrade(args: argparse.Namespace, settings: Settings) -> int:
    # A downgrade that deletes rows, or drops what made a model what it is, must be asked for
    # twice, saying what goes; base (every table) always.
    losses = migrate.downgrade_losses(settings.database_url, args.revision)
    if (losses or args.revision == "base") and not args.yes:
        what = (
            "'base' drops every table and all the data in them"
            if args.revision == "base"
            else f"downgrading to {args.revision} loses data"
        )
        lines = "".join(f"\n  - {loss}" for loss in losses)
        print(f"mixreg db downgrade: {what}:{lines}\nadd --yes to confirm", file=sys.stderr)
        return 2
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
    serve = commands.add_parser(
        "serve",
        help="serve the HTTP API (with its embedded worker unless MIXREG_WORKER=procrastinate)",
    )
    serve.add_argument("--host", help="interface to bind (default: MIXREG_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: MIXREG_PORT or 8000)")
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="API processes serving the port (uvicorn workers; default 1)",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        help="proxies whose X-Forwarded-Proto/-For headers are trusted, comma-separated "
        "(default: MIXREG_FORWARDED_ALLOW_IPS or 127.0.0.1; '*' trusts any)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.set_defaults(handler=with_settings(_serve))

    database = commands.add_parser("db", help="manage the database schema (MIXREG_DATABASE_URL)")
    db_commands = database.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="upgrade to a revision (default: head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(handler=with_settings(_upgrade))
    downgrade = db_commands.add_parser(
        "downgrade", help="downgrade to a revision (a revision id, -1, or base with --yes)"
    )
    downgrade.add_argument("revision", help="the revision to go down to ('base': no tables)")
    downgrade.add_argument(
        "--yes",
        action="store_true",
        help="confirm a downgrade that loses data (to base: all of it)",
    )
    downgrade.set_defaults(handler=with_settings(_downgrade))
    current = db_commands.add_parser("current", help="show the database's revision")
    current.set_defaults(handler=with_settings(_current))
