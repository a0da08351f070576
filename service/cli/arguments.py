"""Argument types shared by the command groups."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    """An integer of at least 1, for counts of processes or fits."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number
