"""``mixreg keys create | list | revoke``: the API keys a server accepts.

Keys are kept, as hashes, in the file named by ``MIXREG_API_KEYS_FILE`` (or ``--file``); a
server reading that file sees a new or revoked key at its next request. ``create`` prints the
key on stdout, once, and nothing else there, so ``KEY=$(mixreg keys create ...)`` works.
Exit codes: 0 done; 1 the key file cannot be read or changed; 2 a bad command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.auth.keys import (
    MAX_NAME_LENGTH,
    SCOPES,
    ApiKey,
    KeyStoreError,
    add_key,
    environment_entry,
    new_key,
    parse_environment_entries,
    read_key_file,
    revoke_key,
)
from service.cli.arguments import with_settings
from service.config import Settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _key_name(text: str) -> str:
    if len(text) > MAX_NAME_LENGTH or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"a key name is printable text of at most {MAX_NAME_LENGTH} characters"
        )
    return text


def _key_file(args: argparse.Namespace, settings: Settings) -> Path | None:
    file: Path | None = args.file or settings.api_keys_file
    return file


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"mixreg keys: {message}", file=sys.stderr)
    return code


def _create(args: argparse.Namespace, settings: Settings) -> int:
    made = new_key(scope=args.scope, name=args.name)
    record = made.record
    if args.env:
        print(made.key)
        print(
            f"API key {record.id} (scope {record.scope}) is shown only this once. Add this entry "
            f"to MIXREG_API_KEYS (entries are separated by commas):\n"
            f"{environment_entry(record)}",
            file=sys.stderr,
        )
        return EXIT_OK
    file = _key_file(args, settings)
    if file is None:
        return _fail(
            "no key file: set MIXREG_API_KEYS_FILE (or pass --file) to keep the key there, or "
            "pass --env to print an entry for MIXREG_API_KEYS instead",
            EXIT_USAGE,
        )
    try:
        add_key(file, record)
    except KeyStoreError as exc:
        return _fail(str(exc))
    print(made.key)
    print(
        f"API key {record.id} (scope {record.scope}) added to {file}; it is shown only this "
        f"once. Send it as 'Authorization: Bearer <key>' (the client and the CLI read "
        f"MIXREG_API_KEY); revoke it with `mixreg keys revoke {record.id}`.",
        file=sys.stderr,
    )
    return EXIT_OK


def _describe(record: ApiKey) -> list[str]:
    status = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "active"
    created = f"{record.created_at:%Y-%m-%d %H:%M}" if record.created_at else "-"
    return [record.id, record.scope, status, created, record.source, record.name or ""]


def _list(args: argparse.Namespace, settings: Settings) -> int:
    file = _key_file(args, settings)
    try:
        records = read_key_file(file) if file is not None else []
        records += parse_environment_entries(settings.api_keys or "")
    except KeyStoreError as exc:
        return _fail(str(exc))
    if not records:
        where = f"in {file}" if file is not None else "(MIXREG_API_KEYS_FILE is not set)"
        print(f"no API keys {where}", file=sys.stderr)
        return EXIT_OK
    rows = [["id", "scope", "status", "created (UTC)", "source", "name"]]
    rows += [_describe(record) for record in records]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return EXIT_OK


def _revoke(args: argparse.Namespace, settings: Settings) -> int:
    try:
        environment = parse_environment_entries(settings.api_keys or "")
    except KeyStoreError as exc:
        return _fail(str(exc))
    environment_ids = {record.id for record in environment}
    if args.id in environment_ids:
        return _fail(
            f"API key {args.id} is an entry of MIXREG_API_KEYS; remove it there and restart the "
            f"server"
        )
    file = _key_file(args, settings)
    if file is None:
        return _fail("no key file: set MIXREG_API_KEYS_FILE or pass --file", EXIT_USAGE)
    try:
        record = revoke_key(file, args.id)
    except KeyStoreError as exc:
        return _fail(str(exc))
    print(f"API key {record.id} is revoked; servers reading {file} refuse it from now on")
    return EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keys`` to the ``mixreg`` command."""
    keys = commands.add_parser(
        "keys", help="create, list and revoke API keys (MIXREG_API_KEYS_FILE)"
    )
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    file_help = "the key file (default: MIXREG_API_KEYS_FILE)"

    create = key_commands.add_parser("create", help="make a key, print it once, keep its hash")
    create.add_argument(
        "--scope",
        required=True,
        choices=SCOPES,
        help="read: GET and predict; write: also fit, upload, cancel and delete",
    )
    create.add_argument("--name", type=_key_name, help="a note saying whose key it is")
    create.add_argument("--file", type=Path, help=file_help)
    create.add_argument(
        "--env",
        action="store_true",
        help="store nothing; print an entry for MIXREG_API_KEYS on stderr instead",
    )
    create.set_defaults(handler=with_settings(_create))

    listing = key_commands.add_parser("list", help="the keys, revoked ones included")
    listing.add_argument("--file", type=Path, help=file_help)
    listing.set_defaults(handler=with_settings(_list))

    revoke = key_commands.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("id", help="the key's id (the 12 hex digits after mixreg_)")
    revoke.add_argument("--file", type=Path, help=file_help)
    revoke.set_defaults(handler=with_settings(_revoke))
