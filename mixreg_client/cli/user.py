"""``mixreg fit | predict | models | jobs | show | alias``: a user's commands, through the
client (``cancel`` and ``registered`` are in :mod:`mixreg_client.cli.registry`).

These commands talk to a running server over HTTP with :mod:`mixreg_client`, like any other
user's script; they never touch the database. Exit codes: 0 done; 1 the server refused the
request or the job failed or was cancelled; 2 a bad command line or an unreadable local file;
3 the server could not be reached; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from mixreg_client import Client, FitJob, Job, MixregError, Model, ModelSummary

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


def _client(args: argparse.Namespace) -> Client:
    # The client finds the server and its key as every script does: --url and --api-key
    # stand for its base_url= and api_key=.
    try:
        return Client(args.url, api_key=args.api_key, timeout=args.timeout)
    except ValueError as exc:
        raise LocalInputError(str(exc)) from None


def _in_command_line_terms(message: str) -> str:
    """A client message with the command's flags beside the client's arguments."""
    return (
        message.replace("pass base_url=", "give --url")
        .replace("pass api_key=", "give --api-key")
        .replace("api_key=", "--api-key")
    )


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _stdout() -> Console:
    # A pipe or file gets full-width lines: ids must not be cut to fit 80 columns.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _command(handler: Handler) -> Handler:
    """Run ``handler``, turning every failure into a one-line message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        # httpx logs every request at INFO; a user's command shows results, not requests.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        try:
            return handler(args)
        except MixregError as exc:
            print(f"mixreg: {_in_command_line_terms(str(exc))}", file=sys.stderr)
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


# --- mixreg fit ---


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


def _format_number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def _status_line(job: Job) -> str:
    progress = job.progress
    parts: list[str] = [job.status]
    if progress.n_components is not None and job.k_values and not job.done:
        parts.append(f"k={progress.n_components}")
    if progress.n_keys is not None:
        parts.append(f"{progress.keys_done or 0:,} of {progress.n_keys:,} keys")
    if progress.best_min_loss is not None:
        parts.append(f"best min-loss {_format_number(progress.best_min_loss)}")
    return ", ".join(parts)


def _ask(question: str) -> bool:
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (KeyboardInterrupt, OSError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _watch(handle: FitJob, *, show_progress: bool) -> Job | None:
    """Follow the job with a live progress bar until it finishes; on Ctrl-C ask whether to
    cancel it. Returns the final job, or None when the user left it running."""
    console = _stderr()
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
            "fit", total=1.0, short_id=handle.id[:8], state=_status_line(handle.last)
        )

        def update(job: Job) -> None:
            bar.update(task, completed=job.progress.fraction, state=_status_line(job))

        try:
            return handle.wait(progress=update)
        except KeyboardInterrupt:
            bar.stop()
    if not _ask(f"\nCancel job {handle.id}? [y/N] "):
        print(
            f"job {handle.id} keeps running; follow it with `mixreg jobs` or "
            f"`mixreg show {handle.id}`",
            file=sys.stderr,
        )
        return None
    handle.cancel()
    return handle.wait()


def _csv_header(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            return [cell.strip() for cell in next(csv.reader(file), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LocalInputError(f"cannot read {path}: {exc}") from None


def _read_dataset_source(args: argparse.Namespace, client: Client) -> str:
    if args.dataset:
        return str(args.dataset)
    path = Path(args.data)
    if not path.is_file():
        raise LocalInputError(f"{path} is not a file; give a .csv, .parquet or .npz file")
    if args.target is None and path.suffix.lower() == ".csv":
        raise LocalInputError(
            f"name the column to predict with --target; {path} has the columns "
            f"{', '.join(_csv_header(path))}"
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


def _fit(args: argparse.Namespace) -> int:
    if (args.data is None) == (args.dataset is None):
        raise LocalInputError("give a data file or --dataset ID (one of them)")
    with _client(args) as client:
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
        console = _stdout()
        if job.sweep is not None:
            _print_sweep(console, job)
        _print_model(console, model, job=job)
    return EXIT_OK


# --- printing models and jobs ---


def _alias(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.version is None:
            alias = client.get_alias(args.name, args.alias)
            print(f"{alias.reference} -> version {alias.version} (model {alias.model_id})")
            return EXIT_OK
        alias = client.set_alias(args.name, args.alias, args.version)
    before = "new" if alias.previous_version is None else f"was version {alias.previous_version}"
    print(f"{alias.reference} -> version {alias.version} (model {alias.model_id}; {before})")
    return EXIT_OK


def _line_equation(model: Model, index: int) -> str:
    component = model.components[index]
    terms = [
        f"{coef:.4g}·{name}" for coef, name in zip(component.coef, model.feature_names, strict=True)
    ]
    if model.fit_intercept:
        terms.append(f"{component.intercept:.4g}")
    return "y = " + " + ".join(terms).replace("+ -", "- ")


def _aliases_of(client: Client, model: ModelSummary) -> list[str]:
    """The aliases that point at a registered model's version (none for other models)."""
    if model.registered_model is None:
        return []
    registered = client.get_registered_model(model.registered_model)
    return sorted(
        alias for alias, version in registered.aliases.items() if version == model.version
    )


def _print_model(
    console: Console, model: Model, *, job: Job | None = None, aliases: Sequence[str] = ()
) -> None:
    console.print(f"model {model.id}")
    if model.registered_model is not None:
        pointed = "".join(f", {model.registered_model}@{alias}" for alias in aliases)
        console.print(
            f"  version           {model.registered_model}/versions/{model.version}{pointed}"
        )
    if job is not None:
        console.print(f"  job               {job.id} ({job.status})")
    console.print(
        f"  algorithm         {model.algorithm}, k={model.n_components}, seed {model.seed}"
    )
    console.print(f"  rows              {model.n_train} training, {model.n_holdout} held out")
    console.print(f"  train min-loss    {_format_number(model.train_min_loss)}")
    baseline = model.baseline_holdout_min_loss
    if baseline is None:
        baseline = model.baseline_train_min_loss
    verdict = "beats it" if model.beats_baseline else "does not beat it"
    console.print(
        f"  holdout min-loss  {_format_number(model.holdout_min_loss)}"
        f"   (one-line baseline {_format_number(baseline)}: {verdict})"
    )
    if model.gate is None:
        console.print(f"  BIC               {_format_number(model.bic, 6)}")
    else:
        console.print(
            f"  BIC               {_format_number(model.gated_bic, 6)} (of the gated mixture)"
        )
    if model.split_by is not None:
        _print_keys(console, model)
    title = "global line" if model.split_by is not None else "line"
    for index, component in enumerate(model.components):
        share = "gate's mean probability" if model.gate is not None else "share"
        console.print(
            f"  {f'{title} {index}':<18}{_line_equation(model, index)}"
            f"   ({share} {component.share:.2f})"
        )
    if model.gate is not None:
        _print_gate(console, model, model.gate)
    for warning in model.warnings:
        console.print(f"  warning           {warning}")


def _print_keys(console: Console, model: Model) -> None:
    """A keyed model's key column and its keys by status."""
    keyed = model.keyed
    if keyed is None:
        console.print(f"  split by          {model.split_by}")
        return
    statuses = ", ".join(f"{count:,} {status}" for status, count in keyed.keys_by_status.items())
    console.print(f"  split by          {model.split_by}: {keyed.n_keys:,} keys ({statuses})")
    without = f", {keyed.rows_without_key:,} without a key" if keyed.rows_without_key else ""
    console.print(f"  keyed rows        {keyed.n_rows:,}{without}")
    quantiles = keyed.min_loss_quantiles
    if quantiles:
        spread = ", ".join(f"{name} {_format_number(value)}" for name, value in quantiles.items())
        console.print(f"  keys' min-loss    {spread}")


def _print_gate(console: Console, model: Model, gate: Mapping[str, Any]) -> None:
    """A gated model's gate: each line's logit, against the first line (the reference)."""
    columns = gate.get("concomitant") or model.feature_names
    console.print(f"  gate              softmax over lines of logits of {', '.join(columns)}")
    for index, (coef, intercept) in enumerate(zip(gate["coef"], gate["intercept"], strict=True)):
        terms = [f"{value:.4g}·{name}" for value, name in zip(coef, columns, strict=True)]
        logit = " + ".join([*terms, f"{intercept:.4g}"]).replace("+ -", "- ")
        reference = "   (reference)" if index == 0 else ""
        console.print(f"  gate {index:<13}logit = {logit}{reference}")


def _print_sweep(console: Console, job: Job) -> None:
    assert job.sweep is not None
    table = Table(title=f"k sweep of job {job.id}", title_justify="left")
    for column in ("k", "train min-loss", "holdout min-loss", "BIC", "beats baseline", "model"):
        table.add_column(column, no_wrap=True)
    for entry in job.sweep.models:
        best = entry.n_components == job.sweep.best_n_components
        table.add_row(
            f"{entry.n_components}{' *' if best else ''}",
            _format_number(entry.train_min_loss),
            _format_number(entry.holdout_min_loss),
            _format_number(entry.bic, 6),
            "yes" if entry.beats_baseline else "no",
            entry.model_id,
        )
    console.print(table)
    console.print(f"BIC prefers k={job.sweep.best_n_components} (*)")


def _models(args: argparse.Namespace) -> int:
    with _client(args) as client:
        models = client.list_models(limit=args.limit)
        # Where each registered model's aliases point, read once per registered model.
        aliases: dict[str, dict[str, int]] = {}
        for model in models:
            name = model.registered_model
            if name is not None and name not in aliases:
                aliases[name] = client.get_registered_model(name).aliases
    if args.json:
        print(json.dumps([model.raw for model in models], indent=2))
        return EXIT_OK
    table = Table()
    for column in ("id", "name", "registered", "aliases", "algorithm", "k", "split by"):
        table.add_column(column, no_wrap=True)
    for column in ("holdout min-loss", "beats baseline", "BIC", "created"):
        table.add_column(column, no_wrap=True)
    for model in models:
        pointing = aliases.get(model.registered_model or "", {})
        table.add_row(*_model_row(model, pointing))
    _stdout().print(table if models else "no models yet")
    return EXIT_OK


def _model_row(model: ModelSummary, aliases: Mapping[str, int]) -> list[str]:
    registered = (
        "" if model.registered_model is None else f"{model.registered_model}/{model.version}"
    )
    return [
        model.id,
        model.name or "",
        registered,
        ",".join(sorted(alias for alias, version in aliases.items() if version == model.version)),
        model.algorithm,
        str(model.n_components),
        model.split_by or "",
        _format_number(model.holdout_min_loss),
        "yes" if model.beats_baseline else "no",
        _format_number(model.bic, 6),
        model.created_at[:19].replace("T", " "),
    ]


def _jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.list_jobs(status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([job.raw for job in jobs], indent=2))
        return EXIT_OK
    table = Table()
    for column in ("id", "status", "progress", "best min-loss", "algorithm", "k", "model"):
        table.add_column(column, no_wrap=True)
    table.add_column("created", no_wrap=True)
    for job in jobs:
        k = ",".join(map(str, job.k_values)) if job.k_values else str(job.n_components)
        table.add_row(
            job.id,
            job.status,
            f"{job.progress.fraction:.0%}",
            _format_number(job.progress.best_min_loss),
            job.algorithm,
            k,
            job.model_id or "",
            job.created_at[:19].replace("T", " "),
        )
    _stdout().print(table if jobs else "no jobs yet")
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            model = client.get_model(args.id)
        except MixregError as exc:
            if exc.status != 404:
                raise
            job = _job_or_none(client, args.id)
            if job is None:
                raise MixregError(
                    f"no model or job has the id {args.id}; list them with `mixreg models` "
                    f"or `mixreg jobs`",
                    status=404,
                    title="Not Found",
                ) from None
            return _show_job(args, client, job)
        aliases = _aliases_of(client, model)
    if args.json:
        print(json.dumps(model.raw, indent=2))
    else:
        _print_model(_stdout(), model, aliases=aliases)
    return EXIT_OK


def _job_or_none(client: Client, job_id: str) -> Job | None:
    try:
        return client.get_job(job_id)
    except MixregError as exc:
        if exc.status == 404:
            return None
        raise


def _show_job(args: argparse.Namespace, client: Client, job: Job) -> int:
    if args.json:
        print(json.dumps(job.raw, indent=2))
        return EXIT_OK
    console = _stdout()
    console.print(f"job {job.id}")
    console.print(f"  status            {job.status} ({job.progress.fraction:.0%})")
    console.print(f"  algorithm         {job.algorithm}, k={job.k_values or job.n_components}")
    if job.error:
        console.print(f"  error             {job.error}")
    if job.sweep is not None:
        _print_sweep(console, job)
    if job.model_id is not None:
        try:
            _print_model(console, client.get_model(job.model_id))
        except MixregError as exc:
            if exc.status != 404:
                raise
            console.print(f"  model             {job.model_id} (deleted)")
    return EXIT_OK


# --- mixreg predict ---


@dataclass(frozen=True)
class CsvTable:
    """A CSV file's header, its rows as numbers, and the cells of columns kept as text."""

    columns: list[str]
    values: np.ndarray
    kept: dict[str, list[str]] = field(default_factory=dict)


def read_csv_table(path: Path, needed: Sequence[str], kept: Sequence[str] = ()) -> CsvTable:
    """Read the columns ``needed`` of a CSV file with a header row, as float64, and the
    columns ``kept`` as the text of their cells."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalInputError(f"cannot read {path}: {exc}") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [cell.strip() for cell in next(reader, [])]
    if not any(header):
        raise LocalInputError(f"{path} is empty; its first line must name the columns")
    missing = [column for column in [*needed, *kept] if column not in header]
    if missing:
        raise LocalInputError(
            f"{path} has no column '{missing[0]}'; its columns are {', '.join(header)}"
        )
    # The rows are split by the csv module and each column converted by NumPy in one call:
    # a Python float() per cell costs more than the request that predicts them.
    rows: list[list[str]] = []
    lines: list[int] = []
    for row in reader:
        # A blank line (or one of empty cells) is skipped; the first cell mostly decides.
        if not row or (not row[0].strip() and not "".join(row).strip()):
            continue
        if len(row) != len(header):
            raise LocalInputError(
                f"{path} line {reader.line_num} has {len(row)} fields, expected {len(header)}"
            )
        rows.append(row)
        lines.append(reader.line_num)
    if not rows:
        raise LocalInputError(f"{path} has a header but no data rows")
    values = np.empty((len(rows), len(needed)), dtype=np.float64)
    for position, column in enumerate(needed):
        values[:, position] = _numeric_column(path, header, rows, lines, header.index(column))
    kept_columns = {column: [row[header.index(column)] for row in rows] for column in kept}
    return CsvTable(columns=list(needed), values=values, kept=kept_columns)


def _numeric_column(
    path: Path, header: list[str], rows: list[list[str]], lines: list[int], index: int
) -> NDArray[np.float64]:
    """Column ``index`` of ``rows`` as numbers; the first cell that is none named by its line."""
    cells = [row[index] for row in rows]
    try:
        return np.array(cells, dtype=np.float64)
    except ValueError:
        # Found again cell by cell only on failure, to name the row and the column.
        for line, cell in zip(lines, cells, strict=True):
            try:
                float(cell)
            except ValueError:
                raise LocalInputError(
                    f"{path} line {line}, column '{header[index]}': "
                    f"'{cell.strip()}' is not a number"
                ) from None
        raise


def _target_column(
    args: argparse.Namespace, client: Client, model: Model, path: Path
) -> str | None:
    if args.target:
        return str(args.target)
    try:
        dataset = client.get_dataset(model.dataset_id)
    except MixregError as exc:
        if exc.status == 404:
            return None
        raise
    if dataset.target_name is None:
        return None
    return dataset.target_name if dataset.target_name in _csv_header(path) else None


def _write_predictions(
    out: TextIO,
    predictions: np.ndarray,
    scores: Any | None,
    kept: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """The CSV of the predictions: the ``kept`` input columns, one column per component and,
    with ``scores``, the best component and its squared error."""
    kept = kept or {}
    header = [*kept, *(f"component_{index}" for index in range(predictions.shape[1]))]
    # Column by column, each converted once: a per-row loop over the scores' derived arrays
    # recomputed them for every row.
    columns: list[Sequence[str]] = list(kept.values())
    columns += [
        list(map(repr, predictions[:, index].tolist())) for index in range(predictions.shape[1])
    ]
    if scores is not None:
        header += ["best", "min_loss"]
        columns.append(list(map(str, scores.best_component.tolist())))
        columns.append(list(map(repr, scores.row_min_loss.tolist())))
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(zip(*columns, strict=True))


def _predict(args: argparse.Namespace) -> int:
    path = Path(args.data)
    if not path.is_file():
        raise LocalInputError(f"{path} is not a file; give a CSV file with a header row")
    with _client(args) as client:
        model = client.get_model(args.model)
        target = _target_column(args, client, model, path)
        needed = [*model.feature_names, *([target] if target else [])]
        kept = list(args.keep or ())
        table = read_csv_table(path, needed, kept)
        X = table.values[:, : len(model.feature_names)]
        scores = None
        if target is None:
            predictions = client.predict(model, X)
        else:
            scores = client.score(model, X, table.values[:, -1])
            predictions = scores.predictions
    if args.output:
        with Path(args.output).open("w", newline="", encoding="utf-8") as out:
            _write_predictions(out, predictions, scores, table.kept)
        summary = (
            f"wrote {len(predictions)} rows x {predictions.shape[1]} components to {args.output}"
        )
        if scores is not None:
            summary += f" (min-loss {_format_number(scores.min_loss)} on '{target}')"
        print(summary, file=sys.stderr)
    else:
        _write_predictions(sys.stdout, predictions, scores, table.kept)
    return EXIT_OK


# --- the parser ---


def _connection_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--url",
        help="the server (default: MIXREG_URL, else http://MIXREG_HOST:MIXREG_PORT)",
    )
    options.add_argument(
        "--api-key", help="sent as 'Authorization: Bearer KEY' (default: MIXREG_API_KEY)"
    )
    options.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for each answer (60)"
    )
    return options


def _add_model_options(fit: argparse.ArgumentParser) -> None:
    """The options of ``POST /fit`` that shape the model: kept columns, weights, groups, a
    gate, a model per key, standard errors and the intercept."""
    fit.add_argument(
        "--keep",
        type=parse_columns,
        metavar="A,B,...",
        help="columns the upload keeps beside the features (never features), such as ids; "
        "the columns of --weights, --groups, --split-by and --gate are kept without it",
    )
    fit.add_argument("--weights", metavar="COLUMN", help="a number column of row weights")
    fit.add_argument(
        "--groups",
        metavar="COLUMN",
        help="a column of group labels: every row of a group on one line (auto, am-classic, em)",
    )
    fit.add_argument(
        "--gate",
        dest="gating",
        type=parse_columns,
        metavar="features|A,B,...",
        help="fit a gate, mixing probabilities that depend on each row: 'features' or the "
        "number columns it reads",
    )
    fit.add_argument(
        "--split-by",
        metavar="COLUMN",
        help="fit a mixture per value of this column (a key such as an account) in one job",
    )
    fit.add_argument(
        "--small-keys",
        choices=["k1", "skip"],
        help="with --split-by: what keys too small for k lines get (the server's default: k1)",
    )
    errors = fit.add_mutually_exclusive_group()
    errors.add_argument(
        "--standard-errors",
        action="store_true",
        default=None,
        help="compute the lines' standard errors (by default: up to 20,000 training rows)",
    )
    errors.add_argument(
        "--no-standard-errors",
        dest="standard_errors",
        action="store_false",
        help="compute none",
    )
    fit.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="also N bootstrap refits for bootstrap standard errors and intervals",
    )
    fit.add_argument(
        "--bootstrap-kind",
        choices=["parametric", "empirical"],
        default="parametric",
        help="how the bootstrap draws its samples (parametric)",
    )
    fit.add_argument("--no-intercept", action="store_true", help="fit lines through the origin")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fit``, ``predict``, ``models``, ``jobs``, ``show`` and ``alias`` to the ``mixreg``
    command."""
    connection = _connection_options()

    fit = commands.add_parser(
        "fit",
        parents=[connection],
        help="upload a data file, fit k lines with a live progress bar, print the model",
        description="Upload DATA (.csv, .parquet or .npz), fit it on the server and follow the "
        "job with a progress bar; Ctrl-C asks whether to cancel the job.",
    )
    fit.add_argument("data", nargs="?", help="a .csv or .parquet file (with --target) or .npz")
    fit.add_argument("--dataset", metavar="ID", help="fit a stored dataset instead of a file")
    fit.add_argument("--target", help="the column to predict (CSV and Parquet files)")
    columns = fit.add_mutually_exclusive_group()
    columns.add_argument(
        "--features",
        type=parse_columns,
        metavar="A,B,...",
        help="the feature columns, in this order (default: every column but the target)",
    )
    columns.add_argument(
        "--ignore",
        type=parse_columns,
        metavar="A,B,...",
        help="columns to leave out, such as an id or a text column",
    )
    fit.add_argument(
        "--na",
        choices=["error", "drop"],
        default="error",
        help="what an empty feature or target cell does: error (default) stops the upload "
        "naming it, drop leaves its row out and says how many per column",
    )
    fit.add_argument(
        "--delimiter",
        help="what separates a CSV file's fields (default: the one of , ; tab | that its "
        "header holds most); 'tab' for a tab",
        type=parse_delimiter,
    )
    fit.add_argument(
        "--k",
        type=parse_k,
        required=True,
        help="the number of lines; a list (1,2,3) or range (1-4) fits each and BIC picks one",
    )
    fit.add_argument("--algorithm", default="auto", help="auto (default), am, am-classic, em, ...")
    fit.add_argument(
        "--param",
        type=parse_param,
        action="append",
        metavar="NAME=VALUE",
        help="an algorithm parameter, e.g. --param n_init=20 (repeatable)",
    )
    fit.add_argument("--seed", type=int, default=0, help="seeds the holdout split and the fit")
    fit.add_argument(
        "--holdout-fraction", type=float, default=0.2, help="share of rows held out (0.2)"
    )
    fit.add_argument("--time-budget", type=float, help="stop the search after this many seconds")
    fit.add_argument("--name", help="a name for the dataset, job and model")
    fit.add_argument(
        "--register",
        metavar="NAME",
        help="make the model the next version of registered model NAME",
    )
    fit.add_argument(
        "--init-model",
        metavar="MODEL",
        help="start from this model's lines (an id, name@alias or name/versions/N)",
    )
    _add_model_options(fit)
    output = fit.add_mutually_exclusive_group()
    output.add_argument("--no-wait", action="store_true", help="print the job id and return")
    output.add_argument("-q", "--quiet", action="store_true", help="print only the model id")
    output.add_argument("--json", action="store_true", help="print the job and model as JSON")
    fit.set_defaults(handler=_command(_fit))

    predict = commands.add_parser(
        "predict",
        parents=[connection],
        help="predict the rows of a CSV file: one column per component",
        description="Predict every row of DATA with MODEL: one column per component; when "
        "the target column is present, also the best component and its squared error.",
    )
    predict.add_argument("model", metavar="MODEL", help="a model id, name@alias or name/versions/N")
    predict.add_argument("data", metavar="DATA", help="a CSV file with the model's features")
    predict.add_argument("-o", "--output", help="write the CSV here (default: standard output)")
    predict.add_argument(
        "--target", help="the target column (default: the fitted dataset's, when present)"
    )
    predict.add_argument(
        "--keep",
        type=parse_columns,
        metavar="A,B,...",
        help="input columns to copy to each output row, such as ids to join on",
    )
    predict.set_defaults(handler=_command(_predict))

    models = commands.add_parser("models", parents=[connection], help="list the fitted models")
    models.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=_command(_models))

    jobs = commands.add_parser("jobs", parents=[connection], help="list fit jobs and progress")
    jobs.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    jobs.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    jobs.add_argument("--json", action="store_true", help="print JSON")
    jobs.set_defaults(handler=_command(_jobs))

    show = commands.add_parser(
        "show", parents=[connection], help="show a model's lines and scores (or a job)"
    )
    show.add_argument(
        "id", metavar="MODEL", help="a model id, name@alias or name/versions/N (or a job id)"
    )
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_command(_show))

    alias = commands.add_parser(
        "alias",
        parents=[connection],
        help="point NAME@ALIAS at a version of a registered model (or show where it points)",
        description="Without VERSION, print the version NAME@ALIAS points at; with it, move "
        "the alias there (every server process follows within MIXREG_ALIAS_REFRESH_S).",
    )
    alias.add_argument("name", metavar="NAME", help="a registered model")
    alias.add_argument("alias", metavar="ALIAS", help="an alias, e.g. production")
    alias.add_argument("version", metavar="VERSION", type=int, nargs="?", help="a version")
    alias.set_defaults(handler=_command(_alias))

    # Imported here: the registry commands use this module's helpers.
    from mixreg_client.cli import registry

    registry.register(commands, connection)
