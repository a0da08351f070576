"""The ``mixreg`` console script: one module per group of commands, each adding its own."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from service.cli import keys, server, user, worker
from service.config import SettingsError, load_settings

# Each module adds its commands with ``register(commands)``; handlers take (args, settings).
COMMAND_GROUPS = (server, user, worker, keys)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``mixreg`` command."""
    parser = argparse.ArgumentParser(
        prog="mixreg",
        description="Fit mixtures of k linear regressions over HTTP. Settings come from "
        "MIXREG_* environment variables (see the README).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mixreg`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"mixreg: {exc}", file=sys.stderr)
        return 2
    result: int = args.handler(args, settings)
    return result
