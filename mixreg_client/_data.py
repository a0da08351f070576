"""What an upload sends: NumPy arrays, a pandas DataFrame, or a CSV, Parquet or NPZ file.

Arrays travel as an NPZ archive (exact float64, no JSON text); a CSV file is sent as it is and
parsed by the server. pandas and pyarrow are never imported here: a DataFrame is read through
its own methods, and pyarrow is imported only to read a Parquet file.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

FINITE_HINT = "all values must be finite numbers"
NA_POLICIES = ("error", "drop")
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
NPZ_SUFFIXES = (".npz",)


@dataclass(frozen=True)
class UploadFile:
    """A file for a multipart upload, with the form fields that go with it."""

    filename: str
    content: bytes
    media_type: str
    fields: dict[str, str | list[str]]
    dropped_rows: dict[str, int] = field(default_factory=dict)
    """Rows left out here by ``na="drop"``, per column with the missing value."""


@dataclass(frozen=True)
class Columns:
    """Which columns of a table are the features: ``features`` in that order, else every column
    but the target and those to ``ignore`` or ``keep`` (kept beside the features as extra
    columns); ``delimiter`` separates a CSV file's fields."""

    features: Sequence[str] | None = None
    ignore: Sequence[str] = ()
    delimiter: str | None = None
    keep: Sequence[str] = ()
    na: str = "error"

    def fields(self) -> dict[str, str | list[str]]:
        """The form fields that ask the server for these columns."""
        fields: dict[str, str | list[str]] = {}
        if self.features is not None:
            fields["features"] = [str(name) for name in self.features]
        if self.ignore:
            fields["ignore"] = [str(name) for name in self.ignore]
        if self.delimiter is not None:
            fields["delimiter"] = self.delimiter
        if self.keep:
            fields["keep"] = [str(name) for name in self.keep]
        if self.na != "error":
            fields["na"] = self.na
        return fields


EVERY_COLUMN = Columns()


def is_dataframe(data: object) -> bool:
    """True for a pandas (or pandas-like) DataFrame, told apart without importing pandas."""
    return hasattr(data, "columns") and hasattr(data, "to_numpy") and hasattr(data, "drop")


def _numbers(values: Any, what: str) -> FloatArray:
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what} must hold numbers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float64)


def check_na(na: str) -> str:
    """``na``, if it is a missing-value policy."""
    if na not in NA_POLICIES:
        raise ValueError(f"na must be one of {', '.join(NA_POLICIES)}, got {na!r}")
    return na


def _describe_non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "infinite" if value > 0 else "-infinite"


def check_finite(array: FloatArray, name: str) -> None:
    """Raise naming the first NaN or infinite entry of ``array`` as the server would
    (``X[0][1] is NaN``): JSON has no such numbers, and the server refuses them."""
    finite = np.isfinite(array)
    if finite.all():
        return
    where = np.argwhere(~finite)[0] if array.ndim else np.zeros(0, dtype=np.int64)
    index = "".join(f"[{int(position)}]" for position in where)
    raise ValueError(
        f"{name}{index} is {_describe_non_finite(float(array[tuple(where)]))}; {FINITE_HINT}"
    )


def _without_missing(
    columns: dict[str, FloatArray], na: str, source: str
) -> tuple[NDArray[np.bool_] | None, dict[str, int]]:
    """The rows to send (None: all) and the rows left out per column, of ``columns`` (the
    features and the target) where NaN marks a missing value; raises naming the first
    missing or infinite value unless ``na`` is ``"drop"``."""
    missing = {name: np.isnan(values) for name, values in columns.items()}
    for name, values in columns.items():
        infinite = np.flatnonzero(np.isinf(values))
        if infinite.size:
            row = int(infinite[0])
            raise ValueError(
                f"column '{name}' of the {source}, row {row} is "
                f"{_describe_non_finite(float(values[row]))}; {FINITE_HINT}"
            )
        if na != "drop" and missing[name].any():
            row = int(np.flatnonzero(missing[name])[0])
            raise ValueError(
                f"column '{name}' of the {source}, row {row} is missing (NaN); pass na='drop' "
                f"to leave out the rows with a missing value"
            )
    dropped = {name: int(gaps.sum()) for name, gaps in missing.items() if gaps.any()}
    if not dropped:
        return None, {}
    rows: NDArray[np.bool_] = ~np.logical_or.reduce(list(missing.values()))
    if not rows.any():
        raise ValueError(f"every row of the {source} has a missing value")
    return rows, dropped


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _kept_array(values: Any) -> Any:
    """A kept column for an NPZ archive: float64 if it holds only numbers (NaN or None where
    missing), else strings (an empty string where missing, which the server reads as
    missing)."""
    array = np.asarray(values)
    if array.dtype.kind in "biuf":
        return np.asarray(array, dtype=np.float64)
    items = array.tolist()
    if all(_is_missing(item) or isinstance(item, int | float) for item in items):
        return np.array([math.nan if item is None else item for item in items], dtype=np.float64)
    return np.array(["" if _is_missing(item) else str(item) for item in items], dtype=str)


def _npz(
    X: FloatArray,
    y: FloatArray,
    feature_names: Sequence[str] | None,
    kept: dict[str, Any] | None = None,
) -> bytes:
    arrays: dict[str, Any] = {"X": X, "y": y, **(kept or {})}
    if feature_names is not None:
        arrays["feature_names"] = np.array([str(name) for name in feature_names], dtype=str)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def arrays_upload(
    X: Any, y: Any, *, feature_names: Sequence[str] | None, name: str | None
) -> UploadFile:
    """``X`` (n x d) and ``y`` (n) as an NPZ archive; raises naming a NaN or infinite value."""
    matrix = _numbers(X, "X")
    if matrix.ndim == 1:
        raise ValueError(
            "X must be 2-dimensional (rows x features); for one feature use X[:, None]"
        )
    if matrix.ndim != 2:
        raise ValueError(f"X must be 2-dimensional (rows x features), got shape {matrix.shape}")
    target = _numbers(y, "y").ravel()
    check_finite(matrix, "X")
    check_finite(target, "y")
    return UploadFile(
        "data.npz", _npz(matrix, target, feature_names), "application/x-npz", _form(name)
    )


def _form(name: str | None) -> dict[str, str | list[str]]:
    return {} if name is None else {"name": name}


def _split_columns(
    columns: Sequence[str], target: str | None, source: str, chosen: Columns = EVERY_COLUMN
) -> tuple[list[str], str]:
    listed = ", ".join(columns)
    if target is None:
        raise ValueError(
            f"name the target column of the {source} with target=; columns are {listed}"
        )
    if target not in columns:
        raise ValueError(f"the {source} has no column '{target}'; columns are {listed}")
    if chosen.delimiter is not None:
        raise ValueError(f"delimiter= applies to a CSV file, not to a {source}")
    if chosen.features is not None and chosen.ignore:
        raise ValueError("give the feature columns or the columns to ignore, not both")
    chosen_names = (
        ("features", chosen.features or ()),
        ("ignore", chosen.ignore),
        ("keep", chosen.keep),
    )
    for option, names in chosen_names:
        for column in names:
            if column not in columns:
                raise ValueError(
                    f"{option} names '{column}', but the {source} has the columns {listed}"
                )
            if column == target:
                raise ValueError(f"{option} names the target column '{target}'")
    for option, names in chosen_names[:2]:
        for column in names:
            if column in chosen.keep:
                raise ValueError(f"keep and {option} both name the column '{column}'")
    if chosen.features is not None:
        features = list(chosen.features)
    else:
        left_out = {*chosen.ignore, *chosen.keep}
        features = [column for column in columns if column != target and column not in left_out]
    if not features:
        raise ValueError(f"the {source} has only the target column '{target}'; add a feature")
    return features, target


def dataframe_upload(
    frame: Any, *, target: str | None, name: str | None, chosen: Columns = EVERY_COLUMN
) -> UploadFile:
    """A DataFrame whose column ``target`` is the target and whose other columns (or those
    ``chosen``) are features."""
    columns = [str(column) for column in frame.columns]
    features, target = _split_columns(columns, target, "DataFrame", chosen)
    by_name = dict(zip(columns, frame.columns, strict=True))
    values = {
        column: _numbers(frame[by_name[column]].to_numpy(), f"column '{column}'")
        for column in [*features, target]
    }
    rows, dropped = _without_missing(values, chosen.na, "DataFrame")
    kept = {column: _kept_array(frame[by_name[column]].to_numpy()) for column in chosen.keep}
    if rows is not None:
        values = {column: column_values[rows] for column, column_values in values.items()}
        kept = {column: column_values[rows] for column, column_values in kept.items()}
    X = np.column_stack([values[column] for column in features])
    return UploadFile(
        "data.npz",
        _npz(X, values[target], features, kept),
        "application/x-npz",
        _kept_form(name, kept, target),
        dropped,
    )


def _kept_form(name: str | None, kept: dict[str, Any], target: str) -> dict[str, str | list[str]]:
    """The form fields of an NPZ upload of a table: its ``target`` column's name (the array
    ``y``) and its ``kept`` arrays, the extra columns."""
    form: dict[str, str | list[str]] = {**_form(name), "target": target}
    return {**form, "keep": list(kept)} if kept else form


def parquet_upload(
    path: Path, *, target: str | None, name: str | None, chosen: Columns = EVERY_COLUMN
) -> UploadFile:
    """A Parquet file read with pyarrow; its column ``target`` is the target."""
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ImportError("reading a Parquet file needs pyarrow: pip install pyarrow") from None
    table = parquet.read_table(path)
    columns = [str(column) for column in table.column_names]
    features, target = _split_columns(columns, target, f"Parquet file {path.name}", chosen)

    def column(column_name: str) -> FloatArray:
        # A null becomes NaN, a missing value like a DataFrame's.
        values = table.column(column_name).to_numpy(zero_copy_only=False)
        return _numbers(values, f"column '{column_name}' of {path.name}")

    values = {column_name: column(column_name) for column_name in [*features, target]}
    rows, dropped = _without_missing(values, chosen.na, f"Parquet file {path.name}")
    kept = {
        kept_name: _kept_array(table.column(kept_name).to_numpy(zero_copy_only=False))
        for kept_name in chosen.keep
    }
    if rows is not None:
        values = {column_name: array[rows] for column_name, array in values.items()}
        kept = {kept_name: array[rows] for kept_name, array in kept.items()}
    X = np.column_stack([values[feature] for feature in features])
    return UploadFile(
        "data.npz",
        _npz(X, values[target], features, kept),
        "application/x-npz",
        _kept_form(name, kept, target),
        dropped,
    )


def path_upload(
    path: str | os.PathLike[str],
    *,
    target: str | None,
    name: str | None,
    chosen: Columns = EVERY_COLUMN,
) -> UploadFile:
    """A file by its suffix: CSV (sent as is, the server reads the ``chosen`` columns),
    Parquet (read here) or NPZ (sent as is)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return parquet_upload(file, target=target, name=name, chosen=chosen)
    if suffix not in CSV_SUFFIXES + NPZ_SUFFIXES:
        raise ValueError(
            f"cannot tell the format of {file.name}; give a .csv, .parquet or .npz file"
        )
    content = file.read_bytes()
    if suffix in NPZ_SUFFIXES:
        if chosen != Columns(keep=chosen.keep):
            raise ValueError(
                f"{file.name} holds arrays, not named columns: features=, ignore=, na= and "
                f"delimiter= apply to CSV files (and features=, ignore=, na= to Parquet files)"
            )
        return UploadFile(
            file.name, content, "application/x-npz", {**_form(name), **chosen.fields()}
        )
    if target is None:
        raise ValueError(f"name the target column of {file.name} with target=")
    return UploadFile(
        file.name, content, "text/csv", {**_form(name), "target": target, **chosen.fields()}
    )


def upload_of(
    data: Any,
    y: Any = None,
    *,
    target: str | None = None,
    feature_names: Sequence[str] | None = None,
    name: str | None = None,
    chosen: Columns = EVERY_COLUMN,
) -> UploadFile:
    """What to send for ``data``: a path, a DataFrame, or ``X`` with ``y``."""
    if isinstance(data, str | os.PathLike):
        if y is not None:
            raise ValueError("y is given with a file; name the file's target column with target=")
        return path_upload(data, target=target, name=name, chosen=chosen)
    if is_dataframe(data):
        if y is not None:
            raise ValueError("y is given with a DataFrame; name its target column with target=")
        return dataframe_upload(data, target=target, name=name, chosen=chosen)
    if y is None:
        raise ValueError("give the targets y with the feature matrix X")
    if chosen != EVERY_COLUMN:
        raise ValueError(
            "features=, ignore=, keep=, na= and delimiter= apply to a table; with arrays, "
            "pass the feature columns as X without missing values (and extra columns in a "
            "DataFrame or an .npz file)"
        )
    return arrays_upload(data, y, feature_names=feature_names, name=name)


def columns_in_model_order(frame: Any, feature_names: Sequence[str]) -> Any:
    """The DataFrame's columns reordered to the model's features, matched by name.

    Like scikit-learn's ``feature_names_in_`` check: a column the model was not fitted on, or a
    feature without its column, is refused rather than matched by position.
    """
    by_name = {str(column): column for column in frame.columns}
    missing = [name for name in feature_names if name not in by_name]
    unknown = [name for name in by_name if name not in feature_names]
    if missing or unknown:
        problems = []
        if missing:
            problems.append(f"lacks the model's features {', '.join(map(repr, missing))}")
        if unknown:
            problems.append(
                f"has columns the model was not fitted on: {', '.join(map(repr, unknown))}"
            )
        raise ValueError(
            f"the DataFrame {' and '.join(problems)}; the model's features are "
            f"{', '.join(feature_names)} (to match columns by position, pass X.to_numpy())"
        )
    return frame[[by_name[name] for name in feature_names]]


def feature_matrix(X: Any) -> list[list[float]]:
    """Rows to predict, as JSON lists: from an array, a list of rows or a DataFrame."""
    values = X.to_numpy() if is_dataframe(X) else X
    matrix = _numbers(values, "X")
    if matrix.ndim == 1:
        raise ValueError(
            "X must be 2-dimensional (rows x features); to predict one row, wrap it: [row]"
        )
    check_finite(matrix, "X")
    rows: list[list[float]] = matrix.tolist()
    return rows


def concomitant_values(values: Any) -> list[list[float]] | dict[str, list[float]]:
    """A gate's columns as JSON: named columns from a DataFrame or a mapping of name to
    values, else rows of values."""
    if is_dataframe(values):
        return {
            str(name): _numbers(values[name].to_numpy(), f"concomitant column {name!r}").tolist()
            for name in values.columns
        }
    if isinstance(values, Mapping):
        return {
            str(name): _numbers(column, f"concomitant column {name!r}").ravel().tolist()
            for name, column in values.items()
        }
    matrix = _numbers(values, "concomitant")
    rows: list[list[float]] = (matrix[:, None] if matrix.ndim == 1 else matrix).tolist()
    return rows


def target_vector(y: Any) -> list[float]:
    """Targets as a JSON list."""
    array = _numbers(y.to_numpy() if hasattr(y, "to_numpy") else y, "y").ravel()
    check_finite(array, "y")
    values: list[float] = array.tolist()
    return values
