"""The values of an upload: its errors, limits and value checks, and JSON rows to arrays.

Every error message names the offending row, column or field so a user can fix the input.
Files (CSV, Parquet, NPZ, ``.npy`` pairs) are read by :mod:`service.data.readers`, one module
per format, in blocks of rows; each checked block is appended to a
:class:`~service.data.staging.StagedDataset` (a temporary file), so an upload of any size needs
the memory of one block; a dataset is stored only once all of it has been read and checked
(docs/adr/0009-datasets-in-row-chunks.md). Column choice is in
:mod:`service.data.column_choice`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from mixreg.service_support import MAX_ABS_Y
from service.checks import (
    IngestError,
    check_text,
    matrix_from_rows,
    resolve_feature_names,
    vector_from_values,
)

FloatArray = NDArray[np.float64]
BinaryFile = IO[bytes]

NA_ERROR = "error"
NA_DROP = "drop"
NA_POLICIES = (NA_ERROR, NA_DROP)
"""What an empty feature or target cell of an upload does: refuse the upload (the default),
or leave its row out."""

BLOCK_BYTES = 8 * 1024 * 1024
"""About this many bytes of float64 rows are read, checked and staged at a time."""


class DatasetTooLargeError(IngestError):
    """The data has more rows or features than the server accepts; the message names the
    setting."""


@dataclass(frozen=True)
class ParsedDataset:
    """Arrays and names read from an upload."""

    X: FloatArray
    y: FloatArray
    feature_names: list[str]
    target_name: str | None
    extra: dict[str, NDArray[Any]] = field(default_factory=dict)
    """The kept columns: float64 numbers, or object arrays of ``str`` (``None`` if missing)."""


@dataclass(frozen=True)
class DatasetLimits:
    """The most rows and features an upload may have, with the settings that set them."""

    max_rows: int | None = None
    max_features: int | None = None
    max_decoded_bytes: int | None = None
    max_text_cell_chars: int | None = None
    rows_setting: str = "MIXREG_MAX_ROWS"
    features_setting: str = "MIXREG_MAX_FEATURES"
    decoded_setting: str = "MIXREG_MAX_DECODED_BYTES"
    text_cell_setting: str = "MIXREG_MAX_TEXT_CELL_CHARS"

    def check_features(self, n_features: int) -> None:
        """Raise ``DatasetTooLargeError`` if ``n_features`` is above the limit."""
        if self.max_features is not None and n_features > self.max_features:
            raise DatasetTooLargeError(
                f"the dataset has {n_features:,} features; at most {self.max_features:,} are "
                f"accepted ({self.features_setting})"
            )

    def check_rows(self, n_rows: int, n_features: int, extra_bytes: int = 0) -> None:
        """Raise ``DatasetTooLargeError`` if ``n_rows`` (so far) of ``n_features`` features
        are more rows than allowed, or more bytes once decoded to float64 with the
        ``extra_bytes`` of the kept columns (8 per number, a text's UTF-8 length)."""
        if self.max_rows is not None and n_rows > self.max_rows:
            raise DatasetTooLargeError(
                f"the dataset has more than {self.max_rows:,} rows; at most {self.max_rows:,} "
                f"are accepted ({self.rows_setting})"
            )
        decoded = decoded_bytes(n_rows, n_features) + extra_bytes
        if self.max_decoded_bytes is not None and decoded > self.max_decoded_bytes:
            kept = f" and {extra_bytes:,} bytes of kept columns" if extra_bytes else ""
            raise DatasetTooLargeError(
                f"the dataset's {n_rows:,} rows of {n_features:,} features and a target take "
                f"{decoded - extra_bytes:,} bytes as float64{kept}; at most "
                f"{self.max_decoded_bytes:,} are accepted ({self.decoded_setting})"
            )

    def check_text_width(self, n_chars: int, *, column: str, row: int | None = None) -> None:
        """Raise ``IngestError`` if a kept text value of ``n_chars`` characters (in data row
        ``row``, counted from 1, when known) is longer than the limit."""
        if self.max_text_cell_chars is None or n_chars <= self.max_text_cell_chars:
            return
        where = f" in data row {row:,}" if row is not None else ""
        raise IngestError(
            f"kept column '{column[:100]}' holds a text of {n_chars:,} characters{where}; "
            f"a kept text may hold at most {self.max_text_cell_chars:,} "
            f"({self.text_cell_setting})"
        )


def decoded_bytes(n_rows: int, n_features: int) -> int:
    """Bytes of ``n_rows`` rows of ``n_features`` float64 features and a float64 target."""
    return 8 * n_rows * (n_features + 1)


NO_LIMITS = DatasetLimits()


def rows_per_block(n_features: int) -> int:
    """Rows of ``n_features`` float64 values (and a target) read at a time."""
    return max(1, BLOCK_BYTES // (8 * (max(1, n_features) + 1)))


def check_fittable_scale(X: FloatArray, y: FloatArray, *, row_offset: int = 0) -> None:
    """Raise if squaring the data overflows: every fit squares y and the rows of X."""
    with np.errstate(over="ignore"):
        row_norms = np.einsum("ij,ij->i", X, X)
    too_large = np.flatnonzero(~np.isfinite(row_norms))
    if too_large.size:
        raise IngestError(
            f"X row {row_offset + int(too_large[0])} is too large: the sum of its squared values "
            f"overflows a float64; scale X down"
        )
    too_large = np.flatnonzero(np.abs(y) > MAX_ABS_Y)
    if too_large.size:
        index = int(too_large[0])
        raise IngestError(
            f"y[{row_offset + index}] = {float(y[index]):g} is too large: squared errors "
            f"overflow a float64 beyond |y| = {MAX_ABS_Y:g}; scale y down"
        )


def check_same_length(X: FloatArray, y: FloatArray) -> None:
    """Raise unless ``y`` has one value per row of ``X``."""
    if y.shape[0] != X.shape[0]:
        raise IngestError(f"y has {y.shape[0]} values but X has {X.shape[0]} rows")


def parse_arrays(
    X_rows: Sequence[Sequence[float]],
    y_values: Sequence[float],
    feature_names: Sequence[str] | None,
    columns: Mapping[str, Sequence[float | str | None]] | None = None,
) -> ParsedDataset:
    """Check JSON rows ``X`` and values ``y`` and convert them to arrays, with the extra
    ``columns`` (numbers or strings, one per row; ``None`` where missing)."""
    X = matrix_from_rows(X_rows)
    y = vector_from_values(y_values)
    check_same_length(X, y)
    check_fittable_scale(X, y)
    names = resolve_feature_names(feature_names, X.shape[1])
    extra = {
        name: extra_column_of_values(values, name=name, n_rows=len(y), feature_names=names)
        for name, values in (columns or {}).items()
    }
    return ParsedDataset(X=X, y=y, feature_names=names, target_name=None, extra=extra)


def extra_column_of_values(
    values: Sequence[float | str | None], *, name: str, n_rows: int, feature_names: Sequence[str]
) -> NDArray[Any]:
    """The JSON extra column ``name``: float64 (NaN where null) if it holds only numbers and
    nulls, else an object array of ``str`` (``None`` where null); raises naming the column if it
    mixes numbers and text, has another length than the rows, or repeats a feature's name.

    Its texts were checked by the request's schema (no NUL character, no unpaired surrogate).
    """
    where = f"columns['{name[:100]}']"
    if not name:
        raise IngestError("columns has a column without a name")
    check_text(name, name="a name in columns")
    if name in feature_names:
        raise IngestError(f"{where} has the name of a feature; an extra column is not a feature")
    if len(values) != n_rows:
        raise IngestError(f"{where} has {len(values)} values but X has {n_rows} rows")
    kinds = {type(value) for value in values if value is not None}
    if str in kinds:
        if kinds != {str}:
            raise IngestError(f"{where} mixes numbers and text; give all its values as one kind")
        return np.asarray(values, dtype=object)
    return np.asarray([np.nan if value is None else value for value in values], dtype=np.float64)


def check_na_policy(na: str) -> None:
    """Raise unless ``na`` is a missing-value policy: ``"error"`` or ``"drop"``."""
    if na not in NA_POLICIES:
        raise IngestError(f"na must be one of {', '.join(NA_POLICIES)}, got '{na}'")
