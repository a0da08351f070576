"""``mixreg fit``: upload a data file (or name a stored dataset), fit it and follow the job
with a live progress bar."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from mixreg_client import Client, FitJob, Job, MixregError
from mixreg_client.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    LocalInputError,
    ask,
    connect,
    csv_header,
    status_line,
    stderr_console,
    stdout_console,
)
from mixreg_client.cli.showing import print_model, print_sweep


def parse_k(text: str) -> int | list[int]:
    """``"2"`` is one k; ``"1,2,3"`` or ``"1-4"`` is a k sweep."""
    try:
        if "," in text:
            return [int(part) for part in text.split(",") if part.strip()]
        if "-" in text.strip("-"):
            low, high = (int(part) for part in text.split("-", 1))
            return list(range(low, high + 1))
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a k: give an integer (2), a list (1,2,3) or a range (1-4)"
        ) from None


def parse_columns(text: str) -> list[str]:
    """``"a,b"``: column names separated by commas."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one column, e.g. --ignore id,comment")
    return names


def parse_delimiter(text: str) -> str:
    """One character; ``tab`` (or ``\\t``) for a tab."""
    return "\t" if text in ("tab", "\\t") else text


def parse_param(text: str) -> tuple[str, Any]:
    """``NAME=VALUE``; the value is read as JSON when it is JSON (numbers, lists), else text."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE (e.g. n_init=20)")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def _watch(handle: FitJob, *, show_progress: bool) -> Job | None:
    """Follow the job with a live progress bar until it finishes; on Ctrl-C ask whether to
    cancel it. Returns the final job, or None when the user left it running."""
    console = stderr_console()
    with Progress(
        TextColumn("[bold]job {task.fields[short_id]}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
        transient=False,
    ) as bar:
        task = bar.add_task(
            "fit", total=1.0, short_id=handle.id[:8], state=status_line(handle.last)
        )

        def update(job: Job) -> None:
            bar.update(task, completed=job.progress.fraction, state=status_line(job))

        try:
            return handle.wait(progress=update)
        except KeyboardInterrupt:
            bar.stop()
    if not ask(f"\nCancel job {handle.id}? [y/N] "):
        print(
            f"job {handle.id} keeps running; follow it with `mixreg jobs` or "
            f"`mixreg show {handle.id}`",
            file=sys.stderr,
        )
        return None
    handle.cancel()
    return handle.wait()


def _read_dataset_source(args: argparse.Namespace, client: Client) -> str:
    if args.dataset:
        return str(args.dataset)
    path = Path(args.data)
    if not path.is_file():
        raise LocalInputError(f"{path} is not a file; give a .csv, .parquet or .npz file")
    if args.target is None and path.suffix.lower() == ".csv":
        raise LocalInputError(
            f"name the column to predict with --target; {path} has the columns "
            f"{', '.join(csv_header(path))}"
        )
    try:
        dataset = client.upload(
            path,
            target=args.target,
            name=args.name,
            features=args.features,
            ignore=args.ignore,
            delimiter=args.delimiter,
            keep=_kept_columns(args),
            na=args.na,
        )
    except (ValueError, OSError, ImportError) as exc:
        raise LocalInputError(f"{path}: {_as_flags(str(exc))}") from None
    except MixregError as exc:
        if exc.status in (413, 415, 422):
            # The server could not use the file: the file is what needs fixing.
            raise LocalInputError(f"{path}: {_as_flags(exc.detail)}") from None
        raise
    if dataset.dropped_rows:
        counts = ", ".join(f"'{column}' {count}" for column, count in dataset.dropped_rows.items())
        print(f"left out rows with a missing value, per column: {counts}", file=sys.stderr)
    return dataset.id


def _kept_columns(args: argparse.Namespace) -> list[str]:
    """The columns the upload keeps beside the features: --keep's, and those the fit reads
    (weights, groups, the key, the gate's columns), which are then never features."""
    named = [args.weights, args.groups, args.split_by]
    if args.gating is not None and args.gating != ["features"]:
        named += args.gating
    kept = list(args.keep or [])
    return kept + [name for name in named if name is not None and name not in kept]


def _gating(columns: list[str] | None) -> str | list[str] | None:
    """--gate features (the gate reads the features) or the columns it reads."""
    return "features" if columns == ["features"] else columns


def _as_flags(message: str) -> str:
    """A message of the client or the server with its option names as this command's flags."""
    for option, flag in (
        ("target=", "--target"),
        ("delimiter=", "--delimiter "),
        ("ignore=", "--ignore "),
        ("na='drop'", "--na drop"),
        ("na=drop", "--na drop"),
    ):
        message = message.replace(option, flag)
    return message


def run_fit(args: argparse.Namespace) -> int:
    if (args.data is None) == (args.dataset is None):
        raise LocalInputError("give a data file or --dataset ID (one of them)")
    with connect(args) as client:
        dataset_id = _read_dataset_source(args, client)
        handle = client.fit(
            dataset_id,
            k=args.k,
            algorithm=args.algorithm,
            params=dict(args.param or []),
            holdout_fraction=args.holdout_fraction,
            seed=args.seed,
            time_budget_s=args.time_budget,
            name=args.name,
            registered_model=args.register,
            init_model=args.init_model,
            weights=args.weights,
            groups=args.groups,
            standard_errors=args.standard_errors,
            n_bootstrap=args.bootstrap,
            bootstrap=args.bootstrap_kind,
            gating=_gating(args.gating),
            split_by=args.split_by,
            small_keys=args.small_keys,
            fit_intercept=not args.no_intercept,
        )
        if args.no_wait:
            print(handle.id)
            return EXIT_OK
        show_progress = not args.quiet and not args.json
        job = _watch(handle, show_progress=show_progress)
        if job is None:
            return EXIT_INTERRUPTED
        if job.status != "succeeded":
            reason = f": {job.error}" if job.error else ""
            print(f"mixreg: job {job.id} {job.status}{reason}", file=sys.stderr)
            return (
                EXIT_INTERRUPTED if job.status == "cancelled" and show_progress else (EXIT_REFUSED)
            )
        assert job.model_id is not None  # a succeeded job has its model
        model = client.get_model(job.model_id)
    if args.quiet:
        print(model.id)
    elif args.json:
        print(json.dumps({"job": job.raw, "model": model.raw}, indent=2))
    else:
        console = stdout_console()
        if job.sweep is not None:
            print_sweep(console, job)
        print_model(console, model, job=job)
    return EXIT_OK
