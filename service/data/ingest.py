"""Turn uploaded data (JSON rows, CSV, NPZ, Parquet) into float64 arrays with precise errors.

Every error message names the offending row, column or field so a user can fix the input.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from mixreg import MAX_ABS_Y

if TYPE_CHECKING:
    from _csv import Reader

FloatArray = NDArray[np.float64]

FINITE_HINT = "all values must be finite numbers"


class IngestError(ValueError):
    """The input data cannot be used; the message says where and why."""


@dataclass(frozen=True)
class ParsedDataset:
    """Arrays and names read from an upload."""

    X: FloatArray
    y: FloatArray
    feature_names: list[str]
    target_name: str | None


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _describe_non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "infinite" if value > 0 else "-infinite"


def check_finite_matrix(X: FloatArray, *, name: str = "X") -> None:
    """Raise if any entry of the 2-D array ``X`` is NaN or infinite, naming the first one."""
    bad = np.argwhere(~np.isfinite(X))
    if bad.size:
        row, column = (int(index) for index in bad[0])
        what = _describe_non_finite(float(X[row, column]))
        raise IngestError(f"{name}[{row}][{column}] is {what}; {FINITE_HINT}")


def check_finite_vector(y: FloatArray, *, name: str = "y") -> None:
    """Raise if any entry of the 1-D array ``y`` is NaN or infinite, naming the first one."""
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        index = int(bad[0])
        what = _describe_non_finite(float(y[index]))
        raise IngestError(f"{name}[{index}] is {what}; {FINITE_HINT}")


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


def check_fittable_scale(X: FloatArray, y: FloatArray) -> None:
    """Raise if squaring the data overflows: every fit squares y and the rows of X."""
    with np.errstate(over="ignore"):
        row_norms = np.einsum("ij,ij->i", X, X)
    too_large = np.flatnonzero(~np.isfinite(row_norms))
    if too_large.size:
        raise IngestError(
            f"X row {int(too_large[0])} is too large: the sum of its squared values overflows a "
            f"float64; scale X down"
        )
    too_large = np.flatnonzero(np.abs(y) > MAX_ABS_Y)
    if too_large.size:
        index = int(too_large[0])
        raise IngestError(
            f"y[{index}] = {float(y[index]):g} is too large: squared errors overflow a float64 "
            f"beyond |y| = {MAX_ABS_Y:g}; scale y down"
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


def parse_csv(data: bytes, *, target: str | None) -> ParsedDataset:
    """Read a CSV with a header row; ``target`` names the column to predict."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"CSV is not UTF-8 text (byte {exc.start} is invalid)") from exc
    # newline="": the csv module itself reads \n, \r\n and \r line ends, also inside quotes.
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return _read_csv(reader, target=target)
    except csv.Error as exc:
        raise IngestError(f"CSV line {reader.line_num} cannot be read: {exc}") from None


def _read_csv(reader: Reader, *, target: str | None) -> ParsedDataset:
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise IngestError("CSV is empty; the first line must be a header naming the columns")
    columns = [cell.strip() for cell in header]
    listed = ", ".join(columns)
    for index, column in enumerate(columns):
        if not column:
            raise IngestError(f"CSV header column {index + 1} has no name; columns are {listed}")
        check_text(column, name=f"CSV header column {index + 1}")
        if columns.index(column) != index:
            raise IngestError(f"CSV header repeats the column '{column}'; columns are {listed}")
    if target is None:
        raise IngestError(
            f"name the target column to predict (form field 'target'); columns are {listed}"
        )
    if target not in columns:
        raise IngestError(f"CSV has no column '{target}'; columns are {listed}")
    if len(columns) < 2:
        raise IngestError(
            f"CSV has only the target column '{target}'; at least one feature is needed"
        )
    values: list[list[float]] = []
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise IngestError(
                f"CSV line {line} has {_count(len(row), 'field')}, expected {len(columns)}"
            )
        parsed: list[float] = []
        for column, cell in zip(columns, row, strict=True):
            parsed.append(_parse_csv_number(cell, line=line, column=column))
        values.append(parsed)
    if not values:
        raise IngestError("CSV has a header but no data rows")
    table = np.asarray(values, dtype=np.float64)
    target_index = columns.index(target)
    X = np.ascontiguousarray(np.delete(table, target_index, axis=1))
    y = np.ascontiguousarray(table[:, target_index])
    check_fittable_scale(X, y)
    feature_names = [column for column in columns if column != target]
    return ParsedDataset(X=X, y=y, feature_names=feature_names, target_name=target)


def _parse_csv_number(cell: str, *, line: int, column: str) -> float:
    text = cell.strip()
    if not text:
        raise IngestError(f"CSV line {line}, column '{column}' is empty; {FINITE_HINT}")
    try:
        value = float(text)
    except ValueError:
        raise IngestError(f"CSV line {line}, column '{column}': '{text}' is not a number") from None
    if not math.isfinite(value):
        raise IngestError(
            f"CSV line {line}, column '{column}' is {_describe_non_finite(value)}; {FINITE_HINT}"
        )
    return value


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
MAX_NPZ_ARRAY_BYTES = 1 << 30
"""An NPZ array may hold at most this many bytes once decompressed (1 GiB)."""


def parse_npz(data: bytes) -> ParsedDataset:
    """Read an ``.npz`` archive with a 2-D array ``X``, a 1-D array ``y`` and optional
    string array ``feature_names``; object arrays are refused (no pickle)."""
    if data.startswith(_NPY_MAGIC):
        raise IngestError("file is a single .npy array; upload an .npz archive with arrays X and y")
    if not data.startswith(_ZIP_MAGIC):
        raise IngestError("file is not a readable NPZ archive: it is not a zip file")
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise IngestError(f"file is not a readable NPZ archive: {exc}") from None
    assert isinstance(archive, np.lib.npyio.NpzFile)  # the data starts with a zip header
    with archive:
        names = list(archive.files)
        listed = ", ".join(names) or "none"
        for required in ("X", "y"):
            if required not in names:
                raise IngestError(f"NPZ has no array '{required}'; arrays are {listed}")
        X = _load_npz_numbers(archive, "X", ndim=2)
        y = _load_npz_numbers(archive, "y", ndim=1)
        raw_names: list[str] | None = None
        if "feature_names" in names:
            stored = _load_npz_array(archive, "feature_names")
            if stored.ndim != 1 or stored.dtype.kind != "U":
                raise IngestError("NPZ array 'feature_names' must be a 1-D array of strings")
            raw_names = [str(item) for item in stored.tolist()]
    if X.shape[0] == 0:
        raise IngestError("X is empty; at least one row is required")
    if X.shape[1] == 0:
        raise IngestError("X row 0 has no values; at least one feature is required")
    X, y = np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64)
    check_finite_matrix(X)
    check_finite_vector(y)
    check_same_length(X, y)
    check_fittable_scale(X, y)
    return ParsedDataset(
        X=X, y=y, feature_names=resolve_feature_names(raw_names, X.shape[1]), target_name=None
    )


def _check_npz_member(archive: np.lib.npyio.NpzFile, key: str) -> None:
    """Read the header of the member ``key`` and refuse it before its data is allocated.

    numpy allocates the whole array its header declares before reading the data, so a header
    claiming more than the member holds (or than ``MAX_NPZ_ARRAY_BYTES``) is rejected here.
    """
    zip_file = archive.zip
    assert zip_file is not None  # an open archive keeps its zip file
    member = f"{key}.npy" if f"{key}.npy" in zip_file.namelist() else key
    size = zip_file.getinfo(member).file_size
    with zip_file.open(member) as stream:
        if stream.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise IngestError(f"NPZ member '{member}' is not a .npy array")
        stream.seek(0)
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        available = size - stream.tell()
    declared = math.prod(shape) * dtype.itemsize
    what = f"NPZ array '{key}' declares shape {tuple(shape)} of {dtype} ({declared:,} bytes)"
    if declared > MAX_NPZ_ARRAY_BYTES:
        raise IngestError(f"{what}; an array may hold at most {MAX_NPZ_ARRAY_BYTES:,} bytes")
    if declared > available:
        raise IngestError(f"{what} but holds only {available:,} bytes")


def _load_npz_array(archive: np.lib.npyio.NpzFile, key: str) -> NDArray[Any]:
    try:
        _check_npz_member(archive, key)
        array = archive[key]
    except IngestError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise IngestError(f"NPZ array '{key}' cannot be read: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise IngestError(f"NPZ member '{key}' is not a .npy array")
    return array


def _load_npz_numbers(archive: np.lib.npyio.NpzFile, key: str, *, ndim: int) -> NDArray[Any]:
    array = _load_npz_array(archive, key)
    if array.ndim != ndim:
        raise IngestError(
            f"NPZ array '{key}' must be {ndim}-dimensional, got shape {tuple(array.shape)}"
        )
    if array.dtype.kind not in "biuf":
        raise IngestError(f"NPZ array '{key}' must hold numbers, got dtype {array.dtype}")
    return array


def parse_arrays(
    X_rows: Sequence[Sequence[float]],
    y_values: Sequence[float],
    feature_names: Sequence[str] | None,
) -> ParsedDataset:
    """Check JSON rows ``X`` and values ``y`` and convert them to arrays."""
    X = matrix_from_rows(X_rows)
    y = vector_from_values(y_values)
    check_same_length(X, y)
    check_fittable_scale(X, y)
    return ParsedDataset(
        X=X, y=y, feature_names=resolve_feature_names(feature_names, X.shape[1]), target_name=None
    )
