"""The ``mixreg`` console script: one module per group of commands, each adding its own."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from service.cli import server
from service.config import Settings

# Each module adds its commands with ``register(commands)``; handlers take (args, settings).
COMMAND_GROUPS = (server,)


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
    result: int = args.handler(args, Settings())
    return result
