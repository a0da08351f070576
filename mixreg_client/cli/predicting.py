"""``mixreg predict``: a CSV file's rows through a model, as CSV (with each row's best line
and squared error when the file has the target column)."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from mixreg_client import Client, MixregError, Model
from mixreg_client.cli.common import (
    EXIT_OK,
    LocalInputError,
    connect,
    csv_header,
    format_number,
)


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
    return dataset.target_name if dataset.target_name in csv_header(path) else None


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


def run_predict(args: argparse.Namespace) -> int:
    path = Path(args.data)
    if not path.is_file():
        raise LocalInputError(f"{path} is not a file; give a CSV file with a header row")
    with connect(args) as client:
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
            summary += f" (min-loss {format_number(scores.min_loss)} on '{target}')"
        print(summary, file=sys.stderr)
    else:
        _write_predictions(sys.stdout, predictions, scores, table.kept)
    return EXIT_OK
