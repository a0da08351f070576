"""The server's commands of the ``mixreg`` console script (``mixreg_client.cli``): one module
per group of commands, each adding its own; their handlers read the server's settings."""

from __future__ import annotations

import argparse

from service.cli import keys, server, worker

COMMAND_GROUPS = (server, worker, keys)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``db``, ``worker`` and ``keys`` to the ``mixreg`` command."""
    for group in COMMAND_GROUPS:
        group.register(commands)
