"""The dataset columns a fit names for its rows' weights and groups: checked before the job is
queued, loaded again by the fit process.

A 422 names the request field and the column: a weight that is missing, negative or all
zero, a group label that is missing, a groups column in which every row is its own group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models_store.tables import Dataset
from service.data.columns import NUMBER, check_columns, load_columns
from service.errors import InvalidInputError

WEIGHTS, GROUPS = "weights", "groups"


def wanted_columns(weights: str | None, groups: str | None) -> dict[str, str]:
    """Request field -> column, for the fields a fit sets."""
    return {field: column for field, column in ((WEIGHTS, weights), (GROUPS, groups)) if column}


def check_fit_columns(dataset: Dataset, wanted: Mapping[str, str]) -> None:
    """422 unless ``dataset`` keeps the columns ``wanted`` names (weights: numbers) with
    values a fit accepts (:func:`check_values`)."""
    if not wanted:
        return
    check_columns(dataset, wanted, {WEIGHTS: {NUMBER}})
    check_values(load_columns(dataset, wanted), wanted)


def check_values(values: Mapping[str, NDArray[Any]], wanted: Mapping[str, str]) -> None:
    """422 naming the field and column for weights that are missing, negative or all zero,
    group labels that are missing, or groups of one row each."""
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
