"""``mixreg worker``: run fits queued with ``MIXREG_WORKER=procrastinate``."""

from __future__ import annotations

import argparse
import sys

from service.cli.arguments import positive_int, with_settings
from service.config import Settings


def _work(args: argparse.Namespace, settings: Settings) -> int:
    if settings.worker != "procrastinate":
        print(
            "mixreg worker: runs the fits queued with MIXREG_WORKER=procrastinate, but "
            f"MIXREG_WORKER is {settings.worker}; set MIXREG_WORKER=procrastinate and a "
            "PostgreSQL MIXREG_DATABASE_URL for the API processes and the workers alike",
            file=sys.stderr,
        )
        return 2
    # Imported here: the other commands need neither Procrastinate nor the fit code.
    from service.jobs.procrastinate_worker import FitWorker
    from service.logs import configure_logging

    configure_logging(settings.log_format)

    concurrency = args.concurrency or settings.worker_concurrency
    FitWorker(settings, concurrency=concurrency).run()
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``worker`` to the ``mixreg`` command."""
    worker = commands.add_parser(
        "worker",
        help="run queued fits (MIXREG_WORKER=procrastinate); start as many as you like",
        description="A Procrastinate worker on the PostgreSQL database of MIXREG_DATABASE_URL: "
        "it runs queued fits, each in its own process, until SIGTERM or SIGINT, when it "
        "hands its running fits back to the queue.",
    )
    worker.add_argument(
        "--concurrency",
        type=positive_int,
        help="fits run at once (default: MIXREG_WORKER_CONCURRENCY or 2)",
    )
    worker.set_defaults(handler=with_settings(_work))
