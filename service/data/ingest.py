"""Turn uploaded data (JSON rows, CSV, Parquet, NPZ, ``.npy`` pairs) into float64 arrays with
precise errors.

Every error message names the offending row, column or field so a user can fix the input.
Files are read in blocks of rows and each checked block is appended to a ``StagedDataset`` (a
temporary file), so an upload of any size needs the memory of one block; a dataset is stored
only once all of it has been read and checked (docs/adr/0009-datasets-in-row-chunks.md).
"""

from __future__ import annotations

import ast
import codecs
import csv
import io
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from mixreg.service_support import MAX_ABS_Y

if TYPE_CHECKING:
    from _csv import Reader

FloatArray = NDArray[np.float64]
BinaryFile = IO[bytes]

FINITE_HINT = "all values must be finite numbers"
NA_ERROR = "error"
NA_DROP = "drop"
NA_POLICIES = (NA_ERROR, NA_DROP)
"""What an empty feature or target cell of an upload does: refuse the upload (the default),
or leave its row out."""

BLOCK_BYTES = 8 * 1024 * 1024
"""About this many bytes of float64 rows are read, checked and staged at a time."""


class IngestError(ValueError):
    """The input data cannot be used; the message says where and why."""


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


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _describe_non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "infinite" if value > 0 else "-infinite"


def check_finite_matrix(X: FloatArray, *, name: str = "X", row_offset: int = 0) -> None:
    """Raise if any entry of the 2-D array ``X`` is NaN or infinite, naming the first one.

    ``row_offset`` is the index of ``X``'s first row in the whole matrix.
    """
    finite = np.isfinite(X)
    if finite.all():
        return
    bad = np.argwhere(~finite)
    if bad.size:
        row, column = (int(index) for index in bad[0])
        what = _describe_non_finite(float(X[row, column]))
        raise IngestError(f"{name}[{row_offset + row}][{column}] is {what}; {FINITE_HINT}")


def check_finite_vector(y: FloatArray, *, name: str = "y", offset: int = 0) -> None:
    """Raise if any entry of the 1-D array ``y`` is NaN or infinite, naming the first one."""
    finite = np.isfinite(y)
    if finite.all():
        return
    bad = np.flatnonzero(~finite)
    if bad.size:
        index = int(bad[0])
        what = _describe_non_finite(float(y[index]))
        raise IngestError(f"{name}[{offset + index}] is {what}; {FINITE_HINT}")


def matrix_from_rows(rows: Sequence[Sequence[float]], *, name: str = "X") -> FloatArray:
    """A finite float64 matrix from a list of equally long rows."""
    if len(rows) == 0:
        raise IngestError(f"{name} is empty; at least one row is required")
    n_columns = len(rows[0])
    if n_columns == 0:
        raise IngestError(f"{name} row 0 has no values; at least one feature is required")
    for index, row in enumerate(rows):
        if len(row) != n_columns:
            raise IngestError(
                f"{name} row {index} has {_count(len(row), 'value')}, expected {n_columns} "
                f"(the length of row 0)"
            )
    matrix = np.asarray(rows, dtype=np.float64)
    check_finite_matrix(matrix, name=name)
    return matrix


def vector_from_values(values: Sequence[float], *, name: str = "y") -> FloatArray:
    """A finite, non-empty float64 vector."""
    if len(values) == 0:
        raise IngestError(f"{name} is empty; at least one value is required")
    vector = np.asarray(values, dtype=np.float64)
    check_finite_vector(vector, name=name)
    return vector


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


def check_text(value: str, *, name: str = "") -> None:
    """Raise if ``value`` cannot be stored as text: a NUL character or an unpaired surrogate."""
    where = f"{name} " if name else ""
    if "\x00" in value:
        raise IngestError(f"{where}contains a NUL character (\\u0000), which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise IngestError(
            f"{where}contains the unpaired surrogate \\u{ord(value[exc.start]):04x}, "
            f"which is not a character"
        ) from None


def resolve_feature_names(names: Sequence[str] | None, n_features: int) -> list[str]:
    """The given feature names checked against ``n_features``, or ``x0, x1, ...``."""
    if names is None:
        return [f"x{index}" for index in range(n_features)]
    if len(names) != n_features:
        raise IngestError(f"feature_names has {len(names)} names but X has {n_features} columns")
    seen: set[str] = set()
    for index, feature in enumerate(names):
        if not feature:
            raise IngestError(f"feature_names[{index}] is empty")
        check_text(feature, name=f"feature_names[{index}]")
        if feature in seen:
            raise IngestError(f"feature_names[{index}] repeats the name '{feature}'")
        seen.add(feature)
    return list(names)


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


# --- staging --------------------------------------------------------------------------------


NUMBER = "number"
STRING = "string"
TEXT = "text"
"""How a kept column arrives: ``number`` and ``string`` are its type already (Parquet, NPZ,
JSON); ``text`` (CSV cells) becomes ``number`` if every value reads as a number."""


class StagedDataset:
    """The checked rows of an upload, appended block by block to temporary files.

    Every block is checked as it arrives (finite, squares that do not overflow, the row limit),
    so when reading ends the whole upload is known to be storable; ``blocks`` then reads it
    back in blocks of any size. Close it (or use it as a context manager) to delete the files.

    ``kept`` maps each kept (extra) column to how it arrives (``NUMBER``, ``STRING`` or
    ``TEXT``); their values go with each block to a temporary Arrow IPC stream, and
    ``with_extras`` reads them back block by block with their inferred types.
    """

    def __init__(
        self,
        *,
        feature_names: list[str],
        target_name: str | None,
        limits: DatasetLimits = NO_LIMITS,
        kept: Mapping[str, str] | None = None,
    ) -> None:
        if not feature_names:
            raise IngestError("the dataset has no feature columns; at least one is required")
        limits.check_features(len(feature_names))
        self.feature_names = feature_names
        self.target_name = target_name
        self.limits = limits
        self.n_rows = 0
        # Rows left out by the missing-value policy ``na="drop"``, per column with the gap.
        self.dropped_rows: dict[str, int] = {}
        self.kept = dict(kept or {})
        clashing = [name for name in self.kept if name in {*feature_names, target_name}]
        if clashing:
            raise IngestError(
                f"keep names '{clashing[0]}', which is "
                f"{'the target' if clashing[0] == target_name else 'a feature'}; a kept column "
                f"is neither"
            )
        # A TEXT column stays a number column while every value read so far is a number.
        self._numeric = {name: arrival != STRING for name, arrival in self.kept.items()}
        self._text_bytes = dict.fromkeys(self.kept, 0)
        # Owned by this object for its lifetime; ``close`` (or leaving ``with``) deletes them.
        self._x_file = tempfile.TemporaryFile(prefix="mixreg-upload-X-")  # noqa: SIM115
        self._y_file = tempfile.TemporaryFile(prefix="mixreg-upload-y-")  # noqa: SIM115
        self._extra_file = (
            tempfile.TemporaryFile(prefix="mixreg-upload-extra-")  # noqa: SIM115
            if self.kept
            else None
        )
        self._extra_writer: Any = None

    @property
    def n_features(self) -> int:
        """Columns of X."""
        return len(self.feature_names)

    @property
    def extra_columns(self) -> list[dict[str, str]]:
        """The kept columns with their types, ``{"name": ..., "type": "number" | "string"}``:
        a CSV column is ``number`` when every value is a number or empty."""
        return [
            {"name": name, "type": NUMBER if self._numeric[name] else STRING} for name in self.kept
        ]

    def append(self, X: FloatArray, y: FloatArray, extra: Mapping[str, Any] | None = None) -> None:
        """Check the next block of rows and add it, with the block's values of every kept
        column (``extra``: a 1-D array or pyarrow array per name).

        Raises ``IngestError`` naming the row (counted over the whole upload) that is not
        finite or too large, and ``DatasetTooLargeError`` past the row or byte limit.
        """
        if X.ndim != 2 or X.shape[1] != self.n_features or y.shape != (X.shape[0],):
            raise ValueError(f"a block of shape {X.shape} and {y.shape} does not fit the dataset")
        batch = self._extra_batch(extra or {}, len(y)) if self.kept else None
        self.limits.check_rows(
            self.n_rows + len(y), self.n_features, self._extra_bytes_with(len(y))
        )
        check_finite_matrix(X, row_offset=self.n_rows)
        check_finite_vector(y, offset=self.n_rows)
        check_fittable_scale(X, y, row_offset=self.n_rows)
        self._x_file.write(np.ascontiguousarray(X, dtype="<f8").data)
        self._y_file.write(np.ascontiguousarray(y, dtype="<f8").data)
        if batch is not None:
            self._write_extra(batch)
        self.n_rows += len(y)

    def _extra_bytes_with(self, n_new: int) -> int:
        """Bytes of the kept values with ``n_new`` more rows: 8 per number, a text's UTF-8
        length (the new block's texts are counted already)."""
        return sum(
            8 * (self.n_rows + n_new) if self._numeric[name] else self._text_bytes[name]
            for name in self.kept
        )

    def _extra_batch(self, extra: Mapping[str, Any], n_rows: int) -> Any:
        """The block's kept values as a record batch (TEXT as strings, trimmed, empty as
        missing), updating the inferred types and the text bytes.

        Every text's length is checked, and the bytes of the kept values counted against the
        limits, before a dictionary-encoded column is expanded: a few bytes of dictionary
        indices may stand for gigabytes of text.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if set(extra) != set(self.kept):
            raise ValueError(
                f"a block brings the kept columns {sorted(extra)}, not {list(self.kept)}"
            )
        arrays = []
        for name, arrival in self.kept.items():
            values = extra[name]
            if arrival == NUMBER:
                array = pa.array(np.asarray(values, dtype=np.float64), pa.float64())
            else:
                array = (
                    values
                    if isinstance(values, pa.Array)
                    else pa.array(np.asarray(values, dtype=object), pa.string())
                )
                if arrival == TEXT:
                    array = pc.utf8_trim_whitespace(array.cast(pa.string()))
                    array = pc.if_else(pc.equal(array, ""), pa.scalar(None, pa.string()), array)
                    if self._numeric[name] and not _reads_as_numbers(array):
                        self._numeric[name] = False
                self._check_text_widths(name, array)
                self._text_bytes[name] += _text_bytes(array)
            if len(array) != n_rows:
                raise ValueError(f"kept column '{name}' has {len(array)} values for {n_rows} rows")
            arrays.append(array)
        self.limits.check_rows(
            self.n_rows + n_rows, self.n_features, self._extra_bytes_with(n_rows)
        )
        arrays = [
            array if self.kept[name] == NUMBER else array.cast(pa.string())
            for name, array in zip(self.kept, arrays, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, names=list(self.kept))

    def _check_text_widths(self, name: str, array: Any) -> None:
        """Raise naming the column and the first data row of a text longer than the limit."""
        import pyarrow.compute as pc

        limit = self.limits.max_text_cell_chars
        if limit is None or len(array) == 0:
            return
        lengths = _text_lengths(array, pc.utf8_length)
        longest = pc.max(lengths).as_py()
        if longest is None or longest <= limit:
            return
        too_long = lengths.fill_null(0).to_numpy(zero_copy_only=False) > limit
        at = int(np.flatnonzero(too_long)[0])
        self.limits.check_text_width(
            int(lengths[at].as_py()), column=name, row=self.n_rows + at + 1
        )

    def _write_extra(self, batch: Any) -> None:
        import pyarrow as pa

        if self._extra_writer is None:
            self._extra_writer = pa.ipc.new_stream(
                pa.PythonFile(self._extra_file, mode="w"), batch.schema
            )
        self._extra_writer.write_batch(batch)

    def _finish_extras(self) -> None:
        if self._extra_writer is not None:
            self._extra_writer.close()
            self._extra_writer = None

    def blocks(self, rows: int) -> Iterator[tuple[FloatArray, FloatArray]]:
        """The staged rows, ``rows`` at a time, in order."""
        self._x_file.seek(0)
        self._y_file.seek(0)
        row_bytes = 8 * self.n_features
        for start in range(0, self.n_rows, rows):
            count = min(rows, self.n_rows - start)
            X = np.frombuffer(self._x_file.read(count * row_bytes), dtype="<f8")
            y = np.frombuffer(self._y_file.read(count * 8), dtype="<f8")
            yield (
                X.astype(np.float64).reshape(count, self.n_features),
                y.astype(np.float64),
            )

    def with_extras(self) -> Iterator[tuple[FloatArray, FloatArray, dict[str, NDArray[Any]]]]:
        """The staged rows in the blocks they were appended in, each with its kept values:
        float64 for a number column (NaN where missing), an object array of ``str`` (``None``
        where missing) for a string one."""
        import pyarrow as pa

        if self._extra_file is None or self.n_rows == 0:
            for X, y in self.blocks(max(self.n_rows, 1)):
                yield X, y, {}
            return
        self._finish_extras()
        self._extra_file.seek(0)
        self._x_file.seek(0)
        self._y_file.seek(0)
        for batch in pa.ipc.open_stream(pa.PythonFile(self._extra_file, mode="r")):
            count = batch.num_rows
            X = np.frombuffer(self._x_file.read(count * 8 * self.n_features), dtype="<f8")
            y = np.frombuffer(self._y_file.read(count * 8), dtype="<f8")
            extra: dict[str, NDArray[Any]] = {}
            for index, name in enumerate(self.kept):
                column = batch.column(index)
                if self._numeric[name]:
                    extra[name] = _float_values(column)
                else:
                    extra[name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
            yield (
                X.astype(np.float64).reshape(count, self.n_features),
                y.astype(np.float64),
                extra,
            )

    def to_parsed(self) -> ParsedDataset:
        """All the staged rows as one pair of arrays, with the kept columns (for small data)."""
        X = np.empty((self.n_rows, self.n_features), dtype=np.float64)
        y = np.empty(self.n_rows, dtype=np.float64)
        extra = {
            column["name"]: np.empty(
                self.n_rows, np.float64 if column["type"] == NUMBER else object
            )
            for column in self.extra_columns
        }
        start = 0
        for X_block, y_block, extra_block in self.with_extras():
            stop = start + len(y_block)
            X[start:stop], y[start:stop] = X_block, y_block
            for name, values in extra_block.items():
                extra[name][start:stop] = values
            start = stop
        return ParsedDataset(
            X=X,
            y=y,
            feature_names=list(self.feature_names),
            target_name=self.target_name,
            extra=extra,
        )

    def close(self) -> None:
        """Delete the temporary files."""
        self._x_file.close()
        self._y_file.close()
        if self._extra_file is not None:
            self._extra_writer = None
            self._extra_file.close()

    def __enter__(self) -> StagedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _text_lengths(array: Any, measure: Any) -> Any:
    """``measure`` (``utf8_length`` or ``binary_length``) of each value of a text array; of a
    dictionary-encoded one without expanding it (its dictionary measured, then taken)."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        return measure(array.dictionary).take(array.indices)
    return measure(array)


def _text_bytes(array: Any) -> int:
    """The UTF-8 bytes of a text array's values, as they take once expanded."""
    import pyarrow.compute as pc

    return int(pc.sum(_text_lengths(array, pc.binary_length)).as_py() or 0)


def _reads_as_numbers(texts: Any) -> bool:
    """Whether every present value of a string array reads as a float."""
    import pyarrow as pa

    try:
        texts.cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _float_values(column: Any) -> FloatArray:
    """A number column (or text that reads as numbers) as float64, NaN where missing."""
    import pyarrow as pa

    numbers = column.cast(pa.float64()).fill_null(float("nan"))
    return np.asarray(numbers.to_numpy(zero_copy_only=False), dtype=np.float64)


def _staged(
    feature_names: list[str],
    target_name: str | None,
    limits: DatasetLimits,
    kept: Mapping[str, str] | None = None,
) -> StagedDataset:
    return StagedDataset(
        feature_names=feature_names, target_name=target_name, limits=limits, kept=kept
    )


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
                        f"{_listed(columns)}"
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


def _delimiter_hint(columns: list[str]) -> str:
    """A hint when a column name holds another delimiter: the file is likely separated by it."""
    for delimiter in CSV_DELIMITERS:
        if any(delimiter in column for column in columns):
            shown = "\\t" if delimiter == "\t" else delimiter
            return (
                f" (the header looks separated by '{shown}': give the delimiter, "
                f"delimiter='{shown}')"
            )
    return ""


def _check_column_names(
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
    listed = _listed(columns)
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


def _listed(columns: list[str]) -> str:
    shown = ", ".join(column[:100] for column in columns[:_LISTED_COLUMNS])
    hidden = len(columns) - _LISTED_COLUMNS
    return f"{shown}, ... ({hidden:,} more)" if hidden > 0 else shown


# --- CSV ------------------------------------------------------------------------------------

_BOM = codecs.BOM_UTF8
_TEXT_BLOCK_BYTES = 1 << 20
CSV_BLOCK_BYTES = 4 * 1024 * 1024
"""Bytes of CSV text pyarrow parses at a time."""


def _csv_lines(source: BinaryFile) -> Iterator[str]:
    """The lines of a UTF-8 CSV (a leading byte order mark dropped), with their line ends.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r``, as the ``csv`` module expects with
    ``newline=""``. Invalid UTF-8 is reported with its byte position in the file. A line that
    spans many blocks is joined once, when it ends, so reading costs time linear in its length.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    consumed = 0
    unfinished: list[str] = []
    first = True
    while True:
        block = source.read(_TEXT_BLOCK_BYTES)
        if first:
            first = False
            if block.startswith(_BOM):
                block = block[len(_BOM) :]
                consumed += len(_BOM)
        final = not block
        buffered = len(decoder.getstate()[0])
        try:
            text = decoder.decode(block, final=final)
        except UnicodeDecodeError as exc:
            position = consumed - buffered + exc.start
            raise IngestError(f"CSV is not UTF-8 text (byte {position} is invalid)") from None
        consumed += len(block)
        if not final and "\n" not in text and "\r" not in text:
            unfinished.append(text)  # the same line goes on
            continue
        unfinished.append(text)
        pending = "".join(unfinished)
        unfinished = []
        lines = list(io.StringIO(pending, newline=""))
        # Keep an unfinished last line (or a '\r' that a '\n' in the next block may complete).
        if not final and lines and (not lines[-1].endswith(("\n", "\r")) or lines[-1][-1] == "\r"):
            unfinished.append(lines.pop())
        yield from lines
        if final:
            return


def detect_delimiter(header: str) -> str:
    """The delimiter of a CSV header line: the candidate it holds most (a comma on a tie)."""
    counts = [header.count(delimiter) for delimiter in CSV_DELIMITERS]
    return CSV_DELIMITERS[counts.index(max(counts))] if max(counts) else ","


def _read_csv_header(reader: Reader) -> list[str]:
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise IngestError("CSV is empty; the first line must be a header naming the columns")
    return [cell.strip() for cell in header]


class _PrivateReader(io.RawIOBase):
    """Reads of ``source`` from a position of its own (``os.pread``, or a copy of the bytes of
    an in-memory file), never moving the position of ``source``.

    pyarrow's CSV reader reads ahead on a thread of its own, and may still be reading when it
    has refused a block and the exact reader starts over from the first byte: sharing the file
    position, the two would each see pieces of the file (a long line read as a short one).
    """

    def __init__(self, source: BinaryFile) -> None:
        super().__init__()
        self._position = 0
        self._fd: int | None = None
        self._memory: memoryview | None = None
        try:
            self._fd = source.fileno()  # a spooled file moves to disk here
        except (AttributeError, OSError, ValueError):
            if not isinstance(source, io.BytesIO):
                raise TypeError(f"cannot read {type(source).__name__} privately") from None
            self._memory = memoryview(source.getvalue())
        if self._fd is not None:
            source.flush()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._position = offset
        elif whence == os.SEEK_CUR:
            self._position += offset
        else:
            self._position = self._size() + offset
        return self._position

    def _size(self) -> int:
        if self._memory is not None:
            return len(self._memory)
        assert self._fd is not None
        return os.fstat(self._fd).st_size

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._memory is not None:
            chunk = self._memory[self._position : self._position + len(view)]
            view[: len(chunk)] = chunk
            count = len(chunk)
        else:
            assert self._fd is not None
            data = os.pread(self._fd, len(view), self._position)
            count = len(data)
            view[:count] = data
        self._position += count
        return count


class _FastPathRefusedError(Exception):
    """The fast CSV reader met something it does not read exactly as the csv module does."""


def _csv_delimiter(source: BinaryFile, delimiter: str | None) -> str:
    """``delimiter``, checked, or the one the first line of ``source`` holds most."""
    if delimiter is not None:
        if len(delimiter) != 1 or delimiter in '\r\n"':
            raise IngestError(
                f"delimiter must be one character other than a quote or a line end, "
                f"got {delimiter!r}"
            )
        return delimiter
    first_line = next(_csv_lines(source), "")
    source.seek(0)
    return detect_delimiter(first_line)


def read_csv(
    source: BinaryFile,
    *,
    target: str | None,
    limits: DatasetLimits = NO_LIMITS,
    choice: ColumnChoice = EVERY_COLUMN,
    delimiter: str | None = None,
    na: str = NA_ERROR,
) -> StagedDataset:
    """Read a CSV with a header row; ``target`` names the column to predict, ``choice`` the
    features, ``delimiter`` what separates the fields (default: the one of ``,;<tab>|`` the
    header holds most); ``na`` what an empty feature or target cell does: ``"error"`` refuses
    the upload naming it, ``"drop"`` leaves its row out, counted per column in
    ``StagedDataset.dropped_rows``.

    The rows are read by pyarrow's streaming CSV reader. When it refuses a block (a value
    that is not a number, a short line, an empty cell...), the file is read again from the
    start by Python's ``csv`` module, which names the exact line and column of the problem (or
    reads a file that only pyarrow found odd, such as a line of blanks).
    """
    check_na_policy(na)
    delimiter = _csv_delimiter(source, delimiter)
    reader = csv.reader(_csv_lines(source), delimiter=delimiter)
    try:
        columns = _read_csv_header(reader)
        header_lines = reader.line_num
    except csv.Error as exc:
        raise IngestError(f"CSV line {reader.line_num} cannot be read: {exc}") from None
    feature_names = _check_column_names(
        columns,
        source="CSV",
        what="CSV header",
        target=target,
        limits=limits,
        choice=choice,
        hint=_delimiter_hint(columns),
    )
    assert target is not None  # checked with the header
    # The columns read: the features, the target, then the kept ones; the others (ids, text)
    # are never parsed.
    used = [*(columns.index(name) for name in feature_names), columns.index(target)]
    kept_at = [columns.index(name) for name in choice.keep]
    kept = dict.fromkeys(choice.keep, TEXT)
    staged = _staged(feature_names, target, limits, kept)
    try:
        _stage_csv_fast(
            _PrivateReader(source),
            staged,
            n_columns=len(columns),
            header_lines=header_lines,
            used=used,
            kept_at=kept_at,
            delimiter=delimiter,
            na=na,
        )
    except _FastPathRefusedError:
        staged.close()
        source.seek(0)
        staged = _staged(feature_names, target, limits, kept)
        try:
            _stage_csv_exact(
                source,
                staged,
                n_columns=len(columns),
                used=used,
                kept_at=kept_at,
                delimiter=delimiter,
                na=na,
            )
        except BaseException:
            staged.close()
            raise
    except BaseException:
        staged.close()
        raise
    finally:
        _release_arrow_memory()
    if staged.n_rows == 0:
        staged.close()
        if staged.dropped_rows:
            raise IngestError(
                f"every CSV row has an empty cell (rows left out by na=drop, per column: "
                f"{_dropped_text(staged.dropped_rows)})"
            )
        raise IngestError("CSV has a header but no data rows")
    return staged


def check_na_policy(na: str) -> None:
    """Raise unless ``na`` is a missing-value policy: ``"error"`` or ``"drop"``."""
    if na not in NA_POLICIES:
        raise IngestError(f"na must be one of {', '.join(NA_POLICIES)}, got '{na}'")


def _dropped_text(dropped: Mapping[str, int]) -> str:
    return ", ".join(f"'{column}' {count}" for column, count in dropped.items())


def _count_dropped(staged: StagedDataset, missing: NDArray[np.bool_], names: list[str]) -> None:
    """Add the rows of ``missing`` (rows x used columns) to the counts of their columns."""
    for name, count in zip(names, missing.sum(axis=0).tolist(), strict=True):
        if count:
            staged.dropped_rows[name] = staged.dropped_rows.get(name, 0) + int(count)


def _release_arrow_memory() -> None:
    """Hand the memory pyarrow pooled while reading back to the system: the process keeps
    serving, and the next upload may be much smaller."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _stage_csv_fast(
    source: BinaryFile | _PrivateReader,
    staged: StagedDataset,
    *,
    n_columns: int,
    header_lines: int,
    used: list[int],
    kept_at: list[int],
    delimiter: str,
    na: str = NA_ERROR,
) -> None:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    names = [f"c{index}" for index in range(n_columns)]
    numbers = [names[index] for index in used]
    texts = [names[index] for index in kept_at]
    try:
        reader = pa_csv.open_csv(
            source,
            read_options=pa_csv.ReadOptions(
                skip_rows=header_lines, column_names=names, block_size=CSV_BLOCK_BYTES
            ),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter),
            convert_options=pa_csv.ConvertOptions(
                column_types={
                    **dict.fromkeys(numbers, pa.float64()),
                    **dict.fromkeys(texts, pa.string()),
                },
                include_columns=[*numbers, *texts],
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=True,
            ),
        )
        for batch in reader:
            # The batch holds the used columns in the order of ``used`` (features, then the
            # target), then the kept ones.
            columns = [
                batch.column(index).to_numpy(zero_copy_only=False) for index in range(len(used))
            ]
            kept = [batch.column(len(used) + index) for index in range(len(texts))]
            if any(batch.column(index).null_count for index in range(len(used))):
                columns, kept = _drop_blank_rows(batch, columns, kept, staged, na)
            X = np.empty((len(columns[0]), len(used) - 1), dtype=np.float64)
            for position, column in enumerate(columns[:-1]):
                X[:, position] = column
            y = np.asarray(columns[-1], dtype=np.float64)
            if not (np.isfinite(X).all() and np.isfinite(y).all()):
                raise _FastPathRefusedError  # the exact reader names the line and column
            staged.append(X, y, dict(zip(staged.kept, kept, strict=True)))
    except pa.ArrowException:
        raise _FastPathRefusedError from None


def _drop_blank_rows(
    batch: Any,
    columns: list[NDArray[Any]],
    kept: list[Any],
    staged: StagedDataset,
    na: str = NA_ERROR,
) -> tuple[list[NDArray[Any]], list[Any]]:
    """The columns (and kept text columns) without the rows whose every cell is empty (as the
    csv reader skips them); a row with some empty cells but not all is refused, or with
    ``na="drop"`` left out too when a feature or the target is empty (counted per column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = np.column_stack(
        [
            *(
                batch.column(index).is_null().to_numpy(zero_copy_only=False)
                for index in range(len(columns))
            ),
            *(
                pc.equal(pc.utf8_trim_whitespace(texts), "")
                .fill_null(True)
                .to_numpy(zero_copy_only=False)
                for texts in kept
            ),
        ]
    )
    blank = empty.all(axis=1)
    partial: NDArray[np.bool_] = np.asarray(empty.any(axis=1) & ~blank)
    if partial.any():
        if na != NA_DROP:
            raise _FastPathRefusedError
        missing = empty[:, : len(columns)] & partial[:, np.newaxis]
        _count_dropped(staged, missing, [*staged.feature_names, str(staged.target_name)])
        # A row whose gaps are all in kept columns stays: a kept column may have gaps.
        blank |= missing.any(axis=1)
    keep_rows = pa.array(~blank)
    return [column[~blank] for column in columns], [texts.filter(keep_rows) for texts in kept]


def _lines_of_at_most(lines: Iterator[str], n_fields: int, delimiter: str) -> Iterator[str]:
    """``lines``, refusing one without quotes that has more than ``n_fields`` fields before
    the csv module splits it (a line of millions of fields would become millions of strings)."""
    for number, line in enumerate(lines, start=1):
        if '"' not in line:
            fields = line.count(delimiter) + 1
            if fields > n_fields:
                raise IngestError(
                    f"CSV line {number} has {_count(fields, 'field')}, expected {n_fields}"
                )
        yield line


def _stage_csv_exact(
    source: BinaryFile,
    staged: StagedDataset,
    *,
    n_columns: int,
    used: list[int],
    kept_at: list[int],
    delimiter: str,
    na: str = NA_ERROR,
) -> None:
    used_names = [*staged.feature_names, str(staged.target_name)]
    reader = csv.reader(
        _lines_of_at_most(_csv_lines(source), n_columns, delimiter), delimiter=delimiter
    )
    try:
        columns = _read_csv_header(reader)
        block_rows = rows_per_block(len(used) + len(kept_at))
        values: list[list[float]] = []
        texts: list[list[str]] = []
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise IngestError(
                    f"CSV line {line} has {_count(len(row), 'field')}, expected {len(columns)}"
                )
            if na == NA_DROP:
                missing = np.array([not row[index].strip() for index in used])
                if missing.any():
                    _count_dropped(staged, missing[np.newaxis, :], used_names)
                    continue
            values.append(
                [
                    _parse_csv_number(
                        row[index], line=line, column=columns[index], feature=index != used[-1]
                    )
                    for index in used
                ]
            )
            texts.append([row[index] for index in kept_at])
            if len(values) == block_rows:
                _stage_csv_rows(staged, values, texts)
                values, texts = [], []
        if values:
            _stage_csv_rows(staged, values, texts)
    except csv.Error as exc:
        raise IngestError(f"CSV line {reader.line_num} cannot be read: {exc}") from None


def _stage_csv_rows(
    staged: StagedDataset, values: list[list[float]], texts: list[list[str]]
) -> None:
    """Stage rows of the used columns, the target last, and their kept cells."""
    table = np.asarray(values, dtype=np.float64)
    X = np.ascontiguousarray(table[:, :-1])
    y = np.ascontiguousarray(table[:, -1])
    cells = np.asarray(texts, dtype=object).reshape(len(texts), len(staged.kept))
    staged.append(X, y, {name: cells[:, index] for index, name in enumerate(staged.kept)})


def _parse_csv_number(cell: str, *, line: int, column: str, feature: bool = False) -> float:
    text = cell.strip()
    if not text:
        raise IngestError(
            f"CSV line {line}, column '{column}' is empty; {FINITE_HINT} (na=drop leaves out "
            f"the rows with an empty cell)"
        )
    try:
        value = float(text)
    except ValueError:
        # A text cell in a feature is most often an id or a title column: say how to leave
        # it out or keep it, in the upload's own words.
        fix = (
            f"; to leave out a column of ids or text, upload with ignore={column}, or keep it "
            f"beside the features with keep={column}"
            if feature
            else ""
        )
        raise IngestError(
            f"CSV line {line}, column '{column}': '{text}' is not a number{fix}"
        ) from None
    if not math.isfinite(value):
        raise IngestError(
            f"CSV line {line}, column '{column}' is {_describe_non_finite(value)}; {FINITE_HINT}"
        )
    return value


def parse_csv(data: bytes, *, target: str | None) -> ParsedDataset:
    """Read a CSV held in memory (see ``read_csv``)."""
    with read_csv(io.BytesIO(data), target=target) as staged:
        return staged.to_parsed()


# --- Parquet --------------------------------------------------------------------------------

PARQUET_MAGIC = b"PAR1"


def read_parquet(
    source: BinaryFile,
    *,
    target: str | None,
    limits: DatasetLimits = NO_LIMITS,
    choice: ColumnChoice = EVERY_COLUMN,
) -> StagedDataset:
    """Read a Parquet file whose column ``target`` is the target and whose other columns (or
    those of ``choice``), all of numbers (integers or floats), are the features; row groups
    are read one at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pa_parquet

    try:
        parquet_file = pa_parquet.ParquetFile(source)
        schema = parquet_file.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IngestError(f"file is not a readable Parquet file: {exc}") from None
    columns = list(schema.names)
    if not columns:
        raise IngestError("Parquet file has no columns")
    feature_names = _check_column_names(
        columns,
        source="Parquet file",
        what="Parquet file",
        target=target,
        limits=limits,
        choice=choice,
    )
    assert target is not None  # checked with the columns
    used = [*feature_names, target]
    for column in (schema.field(name) for name in used):
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            raise IngestError(
                f"Parquet column '{column.name}' holds {column.type}, not numbers; the features "
                f"and the target must hold integers or floats (leave a column out with ignore)"
            )
    kept = {name: _parquet_kept_type(schema.field(name)) for name in choice.keep}
    texts = [name for name, kept_type in kept.items() if kept_type == STRING]
    if texts:
        # Kept texts are read as dictionaries (as they are usually stored), so that their
        # lengths and bytes are checked before they are expanded.
        source.seek(0)
        parquet_file = pa_parquet.ParquetFile(source, read_dictionary=texts)
    text_bytes, text_row_bytes = _parquet_text_sizes(parquet_file.metadata, texts)
    # The row count of the file's footer, and the bytes the kept texts take uncompressed (at
    # least, as stored): too many rows or bytes are refused before any row group is
    # decompressed.
    limits.check_rows(parquet_file.metadata.num_rows, len(feature_names), text_bytes)
    staged = _staged(feature_names, target, limits, kept)
    try:
        # Each batch holds the used columns in that order: the features, the target, then the
        # kept columns.
        batch_rows = max(
            1, BLOCK_BYTES // (8 * (len(feature_names) + 1 + len(kept)) + text_row_bytes)
        )
        batches = parquet_file.iter_batches(batch_size=batch_rows, columns=[*used, *kept])
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise IngestError(
                    f"Parquet file cannot be read past row {staged.n_rows}: {exc}"
                ) from None
            if batch is None:
                break
            _check_parquet_values(batch, used, first_row=staged.n_rows + 1)
            X = np.empty((batch.num_rows, len(feature_names)), dtype=np.float64)
            for position in range(len(feature_names)):
                X[:, position] = batch.column(position).to_numpy(zero_copy_only=False)
            y = np.asarray(batch.column(len(used) - 1).to_numpy(zero_copy_only=False), np.float64)
            extra = {name: _parquet_kept_values(batch.column(name), kept[name]) for name in kept}
            for start, stop in _text_slices(extra, batch.num_rows):
                staged.append(
                    X[start:stop],
                    y[start:stop],
                    {name: values[start:stop] for name, values in extra.items()},
                )
        if staged.n_rows == 0:
            raise IngestError("Parquet file has no rows")
    except BaseException:
        staged.close()
        raise
    finally:
        _release_arrow_memory()
    return staged


def _parquet_kept_type(column: Any) -> str:
    """``NUMBER`` for a kept Parquet column of integers or floats, ``STRING`` for one of text
    (plain, large or dictionary-encoded); raises naming a column of any other type."""
    import pyarrow as pa

    value_type = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_integer(value_type) or pa.types.is_floating(value_type):
        return NUMBER
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return STRING
    raise IngestError(
        f"keep names the Parquet column '{column.name}', which holds {column.type}; a kept "
        f"column must hold numbers (integers or floats) or text"
    )


def _parquet_kept_values(array: Any, kept_type: str) -> Any:
    """A kept Parquet column's values: float64 with NaN where missing, or strings (left
    dictionary-encoded: the staged dataset checks them before it expands them)."""
    import pyarrow as pa

    if kept_type == STRING:
        return array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return _float_values(array)


def _parquet_text_sizes(metadata: Any, texts: Sequence[str]) -> tuple[int, int]:
    """The uncompressed bytes of the columns ``texts`` in every row group, and the most of
    them per row in a row group (to size the blocks read)."""
    total, per_row = 0, 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        stored = sum(
            row_group.column(index).total_uncompressed_size
            for index in range(row_group.num_columns)
            if row_group.column(index).path_in_schema in texts
        )
        total += stored
        per_row = max(per_row, -(-stored // max(row_group.num_rows, 1)))
    return total, per_row


def _text_slices(extra: Mapping[str, Any], n_rows: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of a block whose kept texts each expand to about ``BLOCK_BYTES``
    at most (a range of one row may take more), so that a block of dictionary indices is
    never expanded whole."""
    import pyarrow as pa
    import pyarrow.compute as pc

    row_bytes = np.zeros(n_rows, dtype=np.int64)
    for values in extra.values():
        if isinstance(values, pa.Array) and pa.types.is_dictionary(values.type):
            lengths = _text_lengths(values, pc.binary_length).fill_null(0)
            row_bytes += np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)
    if n_rows == 0 or int(row_bytes.sum()) <= BLOCK_BYTES:
        return [(0, n_rows)]
    ends = np.cumsum(row_bytes)
    slices, start = [], 0
    while start < n_rows:
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + BLOCK_BYTES, side="right"))
        stop = max(stop, start + 1)
        slices.append((start, min(stop, n_rows)))
        start = stop
    return slices


def _check_parquet_values(batch: Any, columns: list[str], *, first_row: int) -> None:
    """Raise naming the first missing (null) or non-finite value of the batch; rows are
    counted from 1 over the whole file."""
    for index, column in enumerate(columns):
        array = batch.column(index)
        if array.null_count:
            row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise IngestError(
                f"Parquet row {first_row + row}, column '{column}' is missing (null); {FINITE_HINT}"
            )
        values = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = int(bad[0])
            raise IngestError(
                f"Parquet row {first_row + row}, column '{column}' is "
                f"{_describe_non_finite(float(values[row]))}; {FINITE_HINT}"
            )


# --- NumPy: .npz archives and .npy pairs ----------------------------------------------------

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
NPY_MAGIC = b"\x93NUMPY"
MAX_NPZ_NAMES_BYTES = 64 * 1024 * 1024
"""The array ``feature_names`` of an NPZ archive may hold at most this many bytes."""
_COPY_BLOCK_BYTES = 1 << 20
# What reading a damaged zip member may raise besides IngestError.
_ZIP_ERRORS = (
    ValueError,
    OSError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
)


def read_npz(
    source: BinaryFile, *, limits: DatasetLimits = NO_LIMITS, keep: Sequence[str] = ()
) -> StagedDataset:
    """Read an ``.npz`` archive with a 2-D array ``X``, a 1-D array ``y`` and optional
    string array ``feature_names``; object arrays are refused (no pickle). The 1-D arrays
    named in ``keep`` (numbers or strings, one value per row) are kept as extra columns.

    The headers of ``X`` and ``y`` are checked (shape, dtype, the size limits) before any of
    their data is read; each is then decompressed to a temporary file and read in blocks of
    rows like a ``.npy`` file, so the memory needed is one block whatever the array's size.
    """
    start = source.read(len(NPY_MAGIC))
    source.seek(0)
    if start.startswith(NPY_MAGIC):
        raise IngestError(
            "file is a single .npy array; upload an .npz archive with arrays X and y, or X and "
            "y as two .npy files (form fields 'X' and 'y')"
        )
    if not start.startswith(_ZIP_MAGIC):
        raise IngestError("file is not a readable NPZ archive: it is not a zip file")
    try:
        archive = zipfile.ZipFile(source)
    except _ZIP_ERRORS as exc:
        raise IngestError(f"file is not a readable NPZ archive: {exc}") from None
    with archive:
        members = {name.removesuffix(".npy"): name for name in archive.namelist()}
        listed = ", ".join(members) or "none"
        for required in ("X", "y"):
            if required not in members:
                raise IngestError(f"NPZ has no array '{required}'; arrays are {listed}")
        X_header = _npz_member_header(archive, members["X"], name="NPZ array 'X'", ndim=2)
        y_header = _npz_member_header(archive, members["y"], name="NPZ array 'y'", ndim=1)
        _, n_features = _check_npy_pair(X_header, y_header, limits=limits)
        raw_names: list[str] | None = None
        if "feature_names" in members:
            raw_names = _npz_feature_names(archive, members["feature_names"], n_features)
        names = resolve_feature_names(raw_names, n_features)
        kept = _npz_kept_headers(
            archive,
            members,
            keep,
            n_rows=X_header.shape[0],
            n_features=n_features,
            limits=limits,
        )
        with ExitStack() as files:
            X_file = files.enter_context(
                _extracted(archive, members["X"], X_header, name="NPZ array 'X'")
            )
            y_file = files.enter_context(
                _extracted(archive, members["y"], y_header, name="NPZ array 'y'")
            )
            kept_files = {
                name: (
                    files.enter_context(
                        _extracted(archive, members[name], header, name=f"NPZ array '{name}'")
                    ),
                    header,
                )
                for name, header in kept.items()
            }
            return _stage_npy_pair(X_file, y_file, X_header, y_header, names, limits, kept_files)


def parse_npz(data: bytes) -> ParsedDataset:
    """Read an ``.npz`` archive held in memory (see ``read_npz``)."""
    with read_npz(io.BytesIO(data)) as staged:
        return staged.to_parsed()


def _npz_member_header(archive: zipfile.ZipFile, member: str, *, name: str, ndim: int) -> NpyHeader:
    """The header of the ``.npy`` member ``member``, checked as ``read_npy_header`` does, its
    data bytes against the member's size; no data is read."""
    try:
        size = archive.getinfo(member).file_size
        with archive.open(member) as stream:
            if stream.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise IngestError(f"NPZ member '{member}' is not a .npy array")
        with archive.open(member) as stream:
            header = _checked_npy_header(stream, name=name, ndim=ndim)
    except IngestError:
        raise
    except _ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    _check_available(header, size - header.data_offset, name=name)
    return header


def _npz_kept_headers(
    archive: zipfile.ZipFile,
    members: Mapping[str, str],
    keep: Sequence[str],
    *,
    n_rows: int,
    n_features: int,
    limits: DatasetLimits,
) -> dict[str, NpyHeader]:
    """The headers of the arrays named in ``keep``: each 1-D, ``n_rows`` long, of numbers or
    strings no wider than the text limit, all of them with the rows within the byte limit
    (a string array counts its declared width: numpy pads every value to it); no data is
    read."""
    kept: dict[str, NpyHeader] = {}
    for name in keep:
        if name in ("X", "y", "feature_names") or name not in members:
            raise IngestError(
                f"keep names '{name}', but the NPZ's arrays besides X, y and feature_names are "
                f"{', '.join(sorted(set(members) - {'X', 'y', 'feature_names'})) or 'none'}"
            )
        if name in kept:
            raise IngestError(f"keep names the array '{name}' twice")
        label = f"NPZ array '{name}'"
        try:
            size = archive.getinfo(members[name]).file_size
            with archive.open(members[name]) as stream:
                shape, fortran_order, dtype = _parse_npy_header(stream, name=label)
                header = NpyHeader(tuple(shape), bool(fortran_order), dtype, stream.tell())
        except IngestError:
            raise
        except _ZIP_ERRORS as exc:
            raise IngestError(f"{label} cannot be read: {exc}") from None
        if len(shape) != 1 or shape[0] != n_rows or dtype.kind not in "biufU":
            raise IngestError(
                f"{label} (kept) must be 1-D numbers or strings with one value per row "
                f"({n_rows:,}), got shape {shape} of {dtype}"
            )
        if dtype.kind == "U":
            # numpy pads every value to the array's width (that of its longest text).
            limits.check_text_width(dtype.itemsize // 4, column=name)
        _check_available(header, size - header.data_offset, name=label)
        kept[name] = header
    limits.check_rows(n_rows, n_features, sum(header.data_bytes for header in kept.values()))
    return kept


def _npz_kept_values(values: NDArray[Any]) -> NDArray[Any]:
    """A block of a kept NPZ array: float64 numbers, or ``str`` (``None`` for an empty
    string, a missing value as in a CSV)."""
    if values.dtype.kind != "U":
        return values.astype(np.float64)
    texts = values.astype(object)
    texts[values == ""] = None
    return texts


def _npz_feature_names(archive: zipfile.ZipFile, member: str, n_features: int) -> list[str]:
    name = "NPZ array 'feature_names'"
    try:
        with archive.open(member) as stream:
            shape, fortran_order, dtype = _parse_npy_header(stream, name=name)
            if len(shape) != 1 or dtype.kind != "U":
                raise IngestError(f"{name} must be a 1-D array of strings")
            declared = math.prod(shape) * dtype.itemsize
            if shape[0] != n_features or declared > MAX_NPZ_NAMES_BYTES:
                raise IngestError(
                    f"feature_names has {shape[0]} names of up to {dtype.itemsize // 4:,} "
                    f"characters but X has {n_features} columns"
                    if shape[0] != n_features
                    else f"{name} declares {declared:,} bytes; at most "
                    f"{MAX_NPZ_NAMES_BYTES:,} are read"
                )
            data = stream.read(declared)
    except IngestError:
        raise
    except _ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    if len(data) < declared:
        raise IngestError(f"{name} declares {declared:,} bytes but holds only {len(data):,}")
    values = np.frombuffer(data, dtype=dtype)
    del fortran_order  # a 1-D array reads the same in either order
    return [str(item) for item in values.tolist()]


@contextmanager
def _extracted(
    archive: zipfile.ZipFile, member: str, header: NpyHeader, *, name: str
) -> Iterator[BinaryFile]:
    """The member ``member`` of ``archive`` copied to a temporary file (deleted on exit), at
    most as many bytes as its header declares."""
    with tempfile.TemporaryFile(prefix="mixreg-upload-npz-") as copy:
        try:
            with archive.open(member) as stream:
                remaining = header.data_offset + header.data_bytes
                while remaining > 0:
                    block = stream.read(min(_COPY_BLOCK_BYTES, remaining))
                    if not block:
                        break
                    copy.write(block)
                    remaining -= len(block)
                # Reading on to the member's end checks its CRC-32.
                stream.read(1)
        except _ZIP_ERRORS as exc:
            raise IngestError(f"{name} cannot be read: {exc}") from None
        copy.seek(0)
        yield copy


@dataclass(frozen=True)
class NpyHeader:
    """What the header of a ``.npy`` file declares, and where its data starts."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype[Any]
    data_offset: int

    @property
    def data_bytes(self) -> int:
        """Bytes of data the header declares."""
        return math.prod(self.shape) * self.dtype.itemsize


NPY_MAX_HEADER_BYTES = 10_000
"""The longest ``.npy`` header read (numpy's own default limit)."""

_NPY_VERSIONS = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf-8")}


def _parse_npy_header(source: BinaryFile, *, name: str) -> tuple[tuple[int, ...], bool, Any]:
    """The shape, Fortran order and dtype a ``.npy`` header at the stream's position declares.

    The header is parsed here rather than by numpy, whose reader falls back to a Python 2
    parser (with a warning) and lets tokenizer errors escape on damaged bytes: any header that
    is not exactly a dict of ``descr``, ``fortran_order`` and ``shape`` is refused.
    """
    unreadable = f"{name} has an unreadable .npy header"
    prefix = source.read(len(NPY_MAGIC) + 2)
    if len(prefix) < len(NPY_MAGIC) + 2 or not prefix.startswith(NPY_MAGIC):
        raise IngestError(f"{name} is not a .npy file (it does not start with \\x93NUMPY)")
    version = (prefix[-2], prefix[-1])
    if version not in _NPY_VERSIONS:
        raise IngestError(
            f"{name} is a .npy file of version {version[0]}.{version[1]}; versions 1.0, 2.0 "
            f"and 3.0 are read"
        )
    length_bytes, encoding = _NPY_VERSIONS[version]
    length = int.from_bytes(source.read(length_bytes), "little")
    if length > NPY_MAX_HEADER_BYTES:
        raise IngestError(f"{unreadable}: it declares {length:,} bytes")
    raw = source.read(length)
    if len(raw) < length:
        raise IngestError(f"{unreadable}: the file ends inside it")
    try:
        header = ast.literal_eval(raw.decode(encoding))
    except Exception:  # any text that is not a Python literal, whatever the parser raises
        raise IngestError(f"{unreadable}: it is not a dictionary literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise IngestError(f"{unreadable}: it must give exactly descr, fortran_order and shape")
    shape, fortran_order = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape
    ):
        raise IngestError(f"{unreadable}: its shape {shape!r} is not a tuple of sizes")
    if not isinstance(fortran_order, bool):
        raise IngestError(f"{unreadable}: fortran_order must be True or False")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except Exception:  # numpy raises several types for a descr it cannot read
        raise IngestError(f"{unreadable}: it declares no dtype numpy knows") from None
    return shape, fortran_order, dtype


def read_npy_header(source: BinaryFile, *, name: str, ndim: int) -> NpyHeader:
    """Read and check the header of a ``.npy`` file of numbers with ``ndim`` dimensions.

    Raises ``IngestError`` naming the file (``name``) when it is not a ``.npy`` file, holds
    something other than numbers (object arrays are never unpickled), has another number of
    dimensions, or holds fewer bytes than its shape needs (a truncated file).
    """
    source.seek(0)
    header = _checked_npy_header(source, name=name, ndim=ndim)
    _check_available(header, source.seek(0, os.SEEK_END) - header.data_offset, name=name)
    source.seek(header.data_offset)
    return header


def read_npz_member_header(archive: zipfile.ZipFile, member: str, *, name: str) -> NpyHeader:
    """What the ``.npy`` header of the archive's ``member`` declares, of any dtype (the caller
    checks it), its data bytes checked against the size the archive declares for the member.

    Only the header is decompressed: a member's data may be asked for once its shape is known
    to be within the limits. Raises ``IngestError`` naming the member (``name``).
    """
    try:
        size = archive.getinfo(member).file_size
        with archive.open(member) as stream:
            shape, fortran_order, dtype = _parse_npy_header(stream, name=name)
            data_offset = stream.tell()
    except IngestError:
        raise
    except _ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    header = NpyHeader(tuple(shape), bool(fortran_order), dtype, data_offset)
    _check_available(header, size - data_offset, name=name)
    return header


def _checked_npy_header(source: BinaryFile, *, name: str, ndim: int) -> NpyHeader:
    """The header at the stream's position, of numbers with ``ndim`` dimensions."""
    start = source.tell()
    shape, fortran_order, dtype = _parse_npy_header(source, name=name)
    header = NpyHeader(tuple(shape), bool(fortran_order), dtype, source.tell() - start)
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise IngestError(f"{name} must hold numbers, got dtype {dtype}")
    if len(header.shape) != ndim:
        raise IngestError(f"{name} must be {ndim}-dimensional, got shape {header.shape}")
    return header


def _check_available(header: NpyHeader, available: int, *, name: str) -> None:
    if header.data_bytes > available:
        raise IngestError(
            f"{name} declares shape {header.shape} of {header.dtype} ({header.data_bytes:,} "
            f"bytes) but holds only {available:,} bytes"
        )


def _npy_rows(source: BinaryFile, header: NpyHeader, rows: int) -> Iterator[NDArray[Any]]:
    """The rows of a 2-D ``.npy`` matrix, ``rows`` at a time.

    In Fortran order each column is stored whole, one after the other: a block of rows is then
    gathered from every column's stretch of the file, so memory stays one block either way.
    """
    n_rows, n_columns = header.shape
    itemsize = header.dtype.itemsize
    source.seek(header.data_offset)
    for start in range(0, n_rows, rows):
        count = min(rows, n_rows - start)
        if not header.fortran_order:
            block = source.read(count * n_columns * itemsize)
            yield np.frombuffer(block, dtype=header.dtype).reshape(count, n_columns)
            continue
        gathered = np.empty((count, n_columns), dtype=header.dtype)
        for column in range(n_columns):
            source.seek(header.data_offset + (column * n_rows + start) * itemsize)
            gathered[:, column] = np.frombuffer(source.read(count * itemsize), header.dtype)
        yield gathered


def _check_npy_pair(
    X_header: NpyHeader, y_header: NpyHeader, *, limits: DatasetLimits
) -> tuple[int, int]:
    """The rows and features of a matrix ``X`` and vector ``y``, checked against each other
    and the limits before any data is read."""
    n_rows, n_features = X_header.shape
    if n_rows == 0:
        raise IngestError("X is empty; at least one row is required")
    if n_features == 0:
        raise IngestError("X row 0 has no values; at least one feature is required")
    if y_header.shape[0] != n_rows:
        raise IngestError(f"y has {y_header.shape[0]} values but X has {n_rows} rows")
    limits.check_features(n_features)
    limits.check_rows(n_rows, n_features)
    return n_rows, n_features


def _stage_npy_pair(
    X_source: BinaryFile,
    y_source: BinaryFile,
    X_header: NpyHeader,
    y_header: NpyHeader,
    feature_names: list[str],
    limits: DatasetLimits,
    kept: Mapping[str, tuple[BinaryFile, NpyHeader]] | None = None,
) -> StagedDataset:
    """Stage ``X`` and ``y`` block by block, with the kept 1-D arrays (each a file and its
    header) read block by block beside them."""
    kept = kept or {}
    types = {
        name: STRING if header.dtype.kind == "U" else NUMBER for name, (_, header) in kept.items()
    }
    staged = _staged(feature_names, None, limits, types)
    try:
        y_source.seek(y_header.data_offset)
        for kept_source, kept_header in kept.values():
            kept_source.seek(kept_header.data_offset)
        row_bytes = 8 * (len(feature_names) + 1) + sum(
            header.dtype.itemsize for _, header in kept.values()
        )
        for X_block in _npy_rows(X_source, X_header, max(1, BLOCK_BYTES // row_bytes)):
            count = X_block.shape[0]
            y_block = np.frombuffer(y_source.read(count * y_header.dtype.itemsize), y_header.dtype)
            staged.append(
                np.asarray(X_block, np.float64),
                np.asarray(y_block, np.float64),
                {
                    name: _npz_kept_values(
                        np.frombuffer(
                            kept_source.read(count * kept_header.dtype.itemsize), kept_header.dtype
                        )
                    )
                    for name, (kept_source, kept_header) in kept.items()
                },
            )
    except BaseException:
        staged.close()
        raise
    return staged


def read_npy_pair(
    X_source: BinaryFile,
    y_source: BinaryFile,
    *,
    feature_names: Sequence[str] | None,
    limits: DatasetLimits = NO_LIMITS,
) -> StagedDataset:
    """Read a 2-D ``.npy`` matrix ``X`` and a 1-D ``.npy`` vector ``y`` of the same length,
    the matrix in blocks of rows (in either memory order)."""
    X_header = read_npy_header(X_source, name="X.npy", ndim=2)
    y_header = read_npy_header(y_source, name="y.npy", ndim=1)
    _, n_features = _check_npy_pair(X_header, y_header, limits=limits)
    names = resolve_feature_names(feature_names, n_features)
    return _stage_npy_pair(X_source, y_source, X_header, y_header, names, limits)
