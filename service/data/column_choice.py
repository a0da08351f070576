"""Which columns of a CSV or Parquet header are the features, which are ignored or kept, and
the checks of the header's names (empty, repeated, missing, too many)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.checks import IngestError, check_text
from service.data.ingest import DatasetLimits

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ColumnChoice:
    """Which columns of a CSV or Parquet file are the features: ``features`` in that order,
    else every column but the target, those to ``ignore`` (an id or a text column) and those
    to ``keep`` (stored beside the features as extra columns, never features)."""

    features: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.features is not None and self.ignore:
            raise IngestError("give the feature columns or the columns to ignore, not both")
        if self.features is not None and not self.features:
            raise IngestError("features lists no column; name at least one")

    def feature_columns(self, columns: list[str], *, target: str, source: str) -> list[str]:
        """The feature columns of ``columns``; raises naming a listed column that is not
        there (in time linear in the columns and the names)."""
        present = set(columns)
        chosen = (("features", self.features or ()), ("ignore", self.ignore), ("keep", self.keep))
        for field_name, names in chosen:
            for name in names:
                if name not in present:
                    raise IngestError(
                        f"{field_name} names '{name}', but {source} has the columns "
                        f"{listed_columns(columns)}"
                    )
                if name == target:
                    raise IngestError(f"{field_name} names the target column '{target}'")
        kept: set[str] = set()
        for name in self.keep:
            if name in kept:
                raise IngestError(f"keep names the column '{name}' twice")
            kept.add(name)
        for field_name, names in chosen[:2]:
            clashing = [name for name in names if name in kept]
            if clashing:
                raise IngestError(
                    f"keep and {field_name} both name the column '{clashing[0]}'; a kept column "
                    f"is never a feature"
                )
        if self.features is not None:
            named: set[str] = set()
            for name in self.features:
                if name in named:
                    raise IngestError(f"features names the column '{name}' twice")
                named.add(name)
            return list(self.features)
        left_out = {*self.ignore, *self.keep}
        return [column for column in columns if column != target and column not in left_out]


EVERY_COLUMN = ColumnChoice()
# The delimiters a CSV header is told apart by, when the upload does not name one.
CSV_DELIMITERS = (",", ";", "\t", "|")


def delimiter_hint(columns: list[str]) -> str:
    """A hint when a column name holds another delimiter: the file is likely separated by it."""
    for delimiter in CSV_DELIMITERS:
        if any(delimiter in column for column in columns):
            shown = "\\t" if delimiter == "\t" else delimiter
            return (
                f" (the header looks separated by '{shown}': give the delimiter, "
                f"delimiter='{shown}')"
            )
    return ""


def check_column_names(
    columns: list[str],
    *,
    source: str,
    what: str,
    target: str | None,
    limits: DatasetLimits,
    choice: ColumnChoice = EVERY_COLUMN,
    hint: str = "",
) -> list[str]:
    """The feature columns of a header; raises naming an empty, repeated or missing column.

    ``source`` names the file ("CSV"), ``what`` the list of columns ("CSV header"), ``hint``
    what to add to the message of a missing target column. The feature limit is checked first
    and the rest in one pass, so a header of any width costs linear time.
    """
    width = len(columns) - (1 if target in columns else 0)
    if choice.features is not None:
        width = min(width, len(choice.features))
    else:
        width -= len({*choice.ignore, *choice.keep})
    limits.check_features(max(width, 0))
    listed = listed_columns(columns)
    seen: set[str] = set()
    for index, column in enumerate(columns):
        if not column:
            raise IngestError(f"{what} column {index + 1} has no name; columns are {listed}")
        check_text(column, name=f"{what} column {index + 1}")
        if column in seen:
            raise IngestError(f"{what} repeats the column '{column}'; columns are {listed}")
        seen.add(column)
    if target is None:
        raise IngestError(
            f"name the column to predict: add the query parameter ?target=NAME to a raw "
            f"text/csv body, or the form field 'target' to a multipart upload; columns are "
            f"{listed}"
        )
    if target not in seen:
        raise IngestError(f"{source} has no column '{target}'; columns are {listed}{hint}")
    features = choice.feature_columns(columns, target=target, source=source)
    if not features:
        raise IngestError(
            f"{source} has only the target column '{target}'; at least one feature is needed"
        )
    return features


_LISTED_COLUMNS = 20
"""Columns an error message lists (a header may have thousands)."""


def listed_columns(columns: list[str]) -> str:
    shown = ", ".join(column[:100] for column in columns[:_LISTED_COLUMNS])
    hidden = len(columns) - _LISTED_COLUMNS
    return f"{shown}, ... ({hidden:,} more)" if hidden > 0 else shown
