"""``mixreg cancel | registered``: stop a job, list registered models, their versions and
aliases (``mixreg alias`` moves an alias), through the client like the other user commands."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from mixreg_client import RegisteredModel
from mixreg_client.cli.common import EXIT_OK, command, connect, stdout_console


def _cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.cancel_job(args.job)
    if args.json:
        print(json.dumps(job.raw, indent=2))
    elif job.status == "cancelled":
        print(f"job {job.id} cancelled")
    elif job.done:
        print(f"job {job.id} had already finished: {job.status}")
    else:
        # Running: its worker stops it within a second or two.
        print(f"job {job.id} is stopping (status {job.status}); `mixreg show {job.id}` follows it")
    return EXIT_OK


def _registered(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.name is None:
            return _print_registered_models(args, client.list_registered_models(limit=args.limit))
        versions = client.list_versions(args.name, limit=args.limit)
    if args.json:
        print(json.dumps([version.raw for version in versions], indent=2))
        return EXIT_OK
    table = Table(title=f"versions of {args.name}", title_justify="left")
    for column in ("version", "aliases", "model", "created"):
        table.add_column(column, no_wrap=True)
    for version in versions:
        table.add_row(
            str(version.version),
            ",".join(sorted(version.aliases)),
            version.model_id,
            version.created_at[:19].replace("T", " "),
        )
    stdout_console().print(table if versions else f"{args.name} has no versions yet")
    return EXIT_OK


def _print_registered_models(args: argparse.Namespace, registered: list[RegisteredModel]) -> int:
    if args.json:
        print(json.dumps([item.raw for item in registered], indent=2))
        return EXIT_OK
    table = Table()
    for column in ("name", "latest version", "aliases", "created"):
        table.add_column(column, no_wrap=True)
    for item in registered:
        aliases = ", ".join(
            f"{alias} -> {version}" for alias, version in sorted(item.aliases.items())
        )
        table.add_row(
            item.name, str(item.latest_version), aliases, item.created_at[:19].replace("T", " ")
        )
    stdout_console().print(table if registered else "no registered models yet")
    return EXIT_OK


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    connection: argparse.ArgumentParser,
) -> None:
    """Add ``cancel`` and ``registered`` to the ``mixreg`` command."""
    cancel = commands.add_parser(
        "cancel",
        parents=[connection],
        help="stop a queued or running fit job",
        description="Cancel JOB: a queued job never runs, a running one stops within a second "
        "or two wherever it runs; a finished job is left as it is.",
    )
    cancel.add_argument("job", metavar="JOB", help="a job id")
    cancel.add_argument("--json", action="store_true", help="print the job as JSON")
    cancel.set_defaults(handler=command(_cancel))

    registered = commands.add_parser(
        "registered",
        parents=[connection],
        help="list registered models and their aliases (with NAME: its versions)",
        description="Without NAME, every registered model with its latest version and where "
        "its aliases point; with NAME, its versions, newest first, and their aliases. Move an "
        "alias with `mixreg alias NAME ALIAS VERSION`.",
    )
    registered.add_argument("name", metavar="NAME", nargs="?", help="a registered model")
    registered.add_argument("--limit", type=int, help="at most this many")
    registered.add_argument("--json", action="store_true", help="print JSON")
    registered.set_defaults(handler=command(_registered))
