"""Checks of the values a request carries, on the ground floor of the service: finite numbers,
text that can be stored, feature names, and the names of registered models.

The request bodies (:mod:`service.schemas`, :mod:`service.fit_schemas`) check their fields with
these before anything else runs; every error names the offending row, column or field.
Nothing here imports the rest of the service.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

FINITE_HINT = "all values must be finite numbers"


class IngestError(ValueError):
    """The input data cannot be used; the message says where and why."""


def count_text(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def describe_non_finite(value: float) -> str:
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
        what = describe_non_finite(float(X[row, column]))
        raise IngestError(f"{name}[{row_offset + row}][{column}] is {what}; {FINITE_HINT}")


def check_finite_vector(y: FloatArray, *, name: str = "y", offset: int = 0) -> None:
    """Raise if any entry of the 1-D array ``y`` is NaN or infinite, naming the first one."""
    finite = np.isfinite(y)
    if finite.all():
        return
    bad = np.flatnonzero(~finite)
    if bad.size:
        index = int(bad[0])
        what = describe_non_finite(float(y[index]))
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
                f"{name} row {index} has {count_text(len(row), 'value')}, expected {n_columns} "
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


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"
"""A registered model's name or an alias: 1 to 128 letters, digits, ``_``, ``.`` or ``-``,
starting with a letter or digit."""
_NAME = re.compile(NAME_PATTERN)
MODEL_ID = re.compile(r"[0-9a-f]{32}")
"""The form of a model id (and of every generated id)."""


def name_error(value: str, *, what: str) -> str | None:
    """Why ``value`` is not a valid registered model name (or alias), naming it as ``what``;
    None if it is one. A name is never of the form of a model id."""
    if not _NAME.fullmatch(value) or MODEL_ID.fullmatch(value):
        return (
            f"{what} '{value[:140]}' is not a valid name: use 1 to 128 letters, digits, '_', "
            f"'.' or '-', starting with a letter or digit, and not 32 hexadecimal digits "
            f"(the form of a model id)"
        )
    return None
