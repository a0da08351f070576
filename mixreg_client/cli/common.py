"""What every ``mixreg`` command shares: the exit codes, the client it talks through, its
consoles, and :func:`command`, which turns every failure into a one-line message and an exit
code.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from mixreg_client import Client, Job, MixregError

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

Handler = Callable[[argparse.Namespace], int]


class LocalInputError(Exception):
    """A local file or argument cannot be used; the message says which and why."""


# --- the server to talk to ---


def connect(args: argparse.Namespace) -> Client:
    # The client finds the server and its key as every script does: --url and --api-key
    # stand for its base_url= and api_key=.
    try:
        return Client(args.url, api_key=args.api_key, timeout=args.timeout)
    except ValueError as exc:
        raise LocalInputError(str(exc)) from None


def in_command_line_terms(message: str) -> str:
    """A client message with the command's flags beside the client's arguments."""
    return (
        message.replace("pass base_url=", "give --url")
        .replace("pass api_key=", "give --api-key")
        .replace("api_key=", "--api-key")
    )


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def stdout_console() -> Console:
    # A pipe or file gets full-width lines: ids must not be cut to fit 80 columns.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def command(handler: Handler) -> Handler:
    """Run ``handler``, turning every failure into a one-line message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        # httpx logs every request at INFO; a user's command shows results, not requests.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        try:
            return handler(args)
        except MixregError as exc:
            print(f"mixreg: {in_command_line_terms(str(exc))}", file=sys.stderr)
            return (
                EXIT_UNREACHABLE
                if exc.status is None and exc.title == "Unreachable"
                else (EXIT_REFUSED)
            )
        except LocalInputError as exc:
            print(f"mixreg: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:
            # The reader of our output went away (`| head`): stop quietly, as `cat` does.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except KeyboardInterrupt:
            print("mixreg: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


def format_number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def status_line(job: Job) -> str:
    progress = job.progress
    parts: list[str] = [job.status]
    if progress.n_components is not None and job.k_values and not job.done:
        parts.append(f"k={progress.n_components}")
    if progress.n_keys is not None:
        parts.append(f"{progress.keys_done or 0:,} of {progress.n_keys:,} keys")
    if progress.best_min_loss is not None:
        parts.append(f"best min-loss {format_number(progress.best_min_loss)}")
    return ", ".join(parts)


def ask(question: str) -> bool:
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (KeyboardInterrupt, OSError):
        return False
    return answer.strip().lower() in ("y", "yes")


def csv_header(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            return [cell.strip() for cell in next(csv.reader(file), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LocalInputError(f"cannot read {path}: {exc}") from None
