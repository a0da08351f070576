"""The ``mixreg`` console script.

The user's commands (``fit``, ``predict``, ``models``, ``jobs``, ``show``) talk to a server
through :mod:`mixreg_client` and need only the client's install (``pip install mixreg``). The
server's commands (``serve``, ``worker``, ``db``, ``keys``) are those of :mod:`service.cli`,
present with ``pip install 'mixreg[server]'``; without it they say how to install them.

Nothing heavy is imported here: a fit process re-runs this script's imports when it starts.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

EXIT_USAGE = 2
SERVER_COMMANDS = ("serve", "worker", "db", "keys")
SERVER_INSTALL = "pip install 'mixreg[server]'"


def _server_cli() -> ModuleType | ImportError:
    """:mod:`service.cli`, or why it cannot be imported (the server is not installed)."""
    try:
        return importlib.import_module("service.cli")
    except ImportError as exc:
        return exc


def _server_missing(why: ImportError) -> argparse.ArgumentParser:
    """Stand-ins for the server's commands that say what to install."""

    def refuse(args: argparse.Namespace) -> int:
        missing = f" (no module {why.name!r})" if why.name else ""
        print(
            f"mixreg {args.command}: the server is not installed{missing}; install it with "
            f"{SERVER_INSTALL}",
            file=sys.stderr,
        )
        return EXIT_USAGE

    stand_in = argparse.ArgumentParser(add_help=False)
    stand_in.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    stand_in.set_defaults(handler=refuse)
    return stand_in


def _user_commands() -> set[str]:
    """The names of the user's commands."""
    from mixreg_client.cli import user

    commands = argparse.ArgumentParser().add_subparsers()
    user.register(commands)
    return set(commands.choices)


def build_parser(*, server: bool = True) -> argparse.ArgumentParser:
    """The argument parser of the ``mixreg`` command (without ``server``: of the user's
    commands only)."""
    from mixreg_client.cli import user

    parser = argparse.ArgumentParser(
        prog="mixreg",
        description="Fit mixtures of k linear regressions over HTTP. Settings come from "
        "MIXREG_* environment variables (see the README).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    user.register(commands)
    if not server:
        return parser
    server_cli = _server_cli()
    if isinstance(server_cli, ModuleType):
        server_cli.register(commands)
    else:
        stand_in = _server_missing(server_cli)
        for name in SERVER_COMMANDS:
            commands.add_parser(
                name, parents=[stand_in], add_help=False, help=f"(needs {SERVER_INSTALL})"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mixreg`` command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    # A user's command needs only the client: importing the server's commands would add half
    # a second to every run of it.
    user_command = bool(arguments) and arguments[0] in _user_commands()
    args = build_parser(server=not user_command).parse_args(arguments)
    result: int = args.handler(args)
    return result
