"""Argument types and the settings shared by the command groups."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from service.config import Settings, SettingsError, load_settings

EXIT_BAD_SETTINGS = 2


def positive_int(value: str) -> int:
    """An integer of at least 1, for counts of processes or fits."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def with_settings(
    handler: Callable[[argparse.Namespace, Settings], int],
) -> Callable[[argparse.Namespace], int]:
    """A server command's handler, given the server's settings (read from ``MIXREG_*``)."""

    def run(args: argparse.Namespace) -> int:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        try:
            settings = load_settings()
        except SettingsError as exc:
            print(f"mixreg: {exc}", file=sys.stderr)
            return EXIT_BAD_SETTINGS
        return handler(args, settings)

    return run
