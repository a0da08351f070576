"""The dataset columns a fit names (its rows' weights and groups, a gate's columns, the key
column of a keyed fit): their names and types checked before the job is queued, from what the
dataset records of them; their values checked by the fit process as it loads them.

Reading a whole column in the request would hold SQLite's write lock (the request's unit of
work) for seconds on millions of rows, so a value a fit cannot take (a weight that is missing,
negative or all zero, a missing group label, groups of one row each, a gate's missing number,
a key that is not an integer) fails the job with a message naming the field and the column,
as the 422 of a name or type does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models_store.tables import Dataset
from service.data.columns import NUMBER, check_columns
from service.errors import InvalidInputError

WEIGHTS, GROUPS = "weights", "groups"


def wanted_columns(weights: str | None, groups: str | None) -> dict[str, str]:
    """Request field -> column, for the fields a fit sets."""
    return {field: column for field, column in ((WEIGHTS, weights), (GROUPS, groups)) if column}


def check_fit_columns(dataset: Dataset, wanted: Mapping[str, str]) -> None:
    """422 unless ``dataset`` keeps the columns ``wanted`` names (weights: numbers); their
    values are the fit process's to check (:func:`check_values`)."""
    if wanted:
        check_columns(dataset, wanted, {WEIGHTS: {NUMBER}})


def check_values(values: Mapping[str, NDArray[Any]], wanted: Mapping[str, str]) -> None:
    """``InvalidInputError`` naming the field and column for weights that are missing,
    negative or all zero, group labels that are missing, or groups of one row each."""
    if WEIGHTS in values:
        _check_weights(np.asarray(values[WEIGHTS], dtype=np.float64), wanted[WEIGHTS])
    if GROUPS in values:
        _check_groups(values[GROUPS], wanted[GROUPS])


def _check_weights(weights: NDArray[np.float64], column: str) -> None:
    missing = np.flatnonzero(~np.isfinite(weights))
    if missing.size:
        raise InvalidInputError(
            f"weights: column '{column}' has no finite number in row {int(missing[0])}; every "
            f"row needs a weight"
        )
    negative = np.flatnonzero(weights < 0)
    if negative.size:
        row = int(negative[0])
        raise InvalidInputError(
            f"weights: column '{column}' is {weights[row]:g} in row {row}; weights must be >= 0"
        )
    if not (weights > 0).any():
        raise InvalidInputError(
            f"weights: column '{column}' is zero in every row; at least one row must weigh "
            f"more than zero"
        )


def _check_groups(labels: NDArray[Any], column: str) -> None:
    if labels.dtype.kind == "f":
        missing = np.flatnonzero(np.isnan(labels))
    else:
        missing = np.flatnonzero(labels == None)  # noqa: E711 (elementwise on an object array)
    if missing.size:
        raise InvalidInputError(
            f"groups: column '{column}' has no label in row {int(missing[0])}; every row needs "
            f"a group"
        )
    n_groups = np.unique(labels).size
    if n_groups == labels.size and labels.size > 1:
        raise InvalidInputError(
            f"groups: every row is its own group (column '{column}' has {n_groups} distinct "
            f"labels for {labels.size} rows); name a column whose groups hold several rows, or "
            f"fit without groups"
        )


def check_concomitant_values(values: NDArray[np.float64], names: Sequence[str]) -> None:
    """``InvalidInputError`` naming the first of a gate's columns (``values``: one per column
    ``names`` lists, in row order) that misses a number in some row."""
    for position, name in enumerate(names):
        missing = np.flatnonzero(~np.isfinite(values[:, position]))
        if missing.size:
            raise InvalidInputError(
                f"gating[{position}] names '{name}' which has no number in row "
                f"{int(missing[0])}; a gate's column needs a number in every row"
            )


def check_integer_keys(keys: NDArray[Any], name: str) -> NDArray[Any]:
    """``keys`` (a block of the key column ``name``) unless it is a number column with a
    number that is not an integer (``InvalidInputError`` naming ``split_by``)."""
    if keys.dtype.kind != "f":
        return keys
    given = keys[np.isfinite(keys)]
    fractional = given[given != np.round(given)]
    if fractional.size:
        raise InvalidInputError(
            f"split_by names '{name}' whose numbers are not all integers (e.g. "
            f"{fractional[0]:g}); keys are text or integers"
        )
    return keys
