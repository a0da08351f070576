"""The rows of one fit, checked: features, target, weights, groups and concomitant columns.

Rows of weight zero are dropped (a row of weight zero is a row that is not there), equal
weights become no weights, and group labels are coded, so every algorithm sees only the rows
that count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._loss import Grouping
from ._solvers import GROUPED_ALGORITHMS
from ._validation import check_concomitant, check_groups, check_sample_weight, check_X_y

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class FitData:
    """The checked rows of a fit.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    weights : ndarray of shape (n_samples,) or None
        Positive and not all equal; None for equal weights.
    gate_columns : ndarray of shape (n_samples, n_concomitant) or None
        The concomitant columns a gate reads; None when it reads the features.
    group_labels : ndarray of shape (n_groups,) or None
        The distinct group labels, in the order of ``grouping``'s codes.
    grouping : Grouping or None
    """

    X: FloatArray
    y: FloatArray
    weights: FloatArray | None
    gate_columns: FloatArray | None
    group_labels: NDArray[Any] | None
    grouping: Grouping | None


def check_fit_data(
    X: ArrayLike,
    y: ArrayLike,
    sample_weight: ArrayLike | None,
    groups: ArrayLike | None,
    concomitant: ArrayLike | None,
    *,
    algorithm: Any,
    standard_errors: bool,
    gating: bool,
) -> FitData:
    """The rows of a fit, checked; ValueError naming ``sample_weight``, ``groups``,
    ``concomitant`` or the array that is wrong."""
    X_arr, y_arr = check_X_y(X, y)
    weights = None if sample_weight is None else check_sample_weight(sample_weight, len(y_arr))
    group_labels: NDArray[Any] | None = None
    codes: NDArray[np.intp] | None = None
    if concomitant is not None and not gating:
        raise ValueError(
            "concomitant columns were given but gating=False: set gating=True to let the "
            "mixing probabilities depend on them"
        )
    gate_columns = (
        None if concomitant is None else check_concomitant(concomitant, n_samples=len(y_arr))
    )
    if groups is not None:
        if algorithm not in GROUPED_ALGORITHMS:
            raise ValueError(
                f"groups: algorithm={algorithm!r} does not fit groups; use one of "
                f"{', '.join(repr(name) for name in GROUPED_ALGORITHMS)}"
            )
        if standard_errors:
            raise ValueError(
                "groups: standard errors are computed for ungrouped rows only; fit with "
                "standard_errors=False"
            )
        group_labels, codes = check_groups(groups, len(y_arr))
    if weights is not None:
        kept = weights > 0
        if not kept.all():
            # A row of weight zero is a row that is not there.
            X_arr, y_arr, weights = X_arr[kept], y_arr[kept], weights[kept]
            if gate_columns is not None:
                gate_columns = gate_columns[kept]
            if codes is not None and group_labels is not None:
                present, codes = np.unique(codes[kept], return_inverse=True)
                group_labels, codes = group_labels[present], codes.ravel()
        if np.all(weights == weights[0]):
            weights = None
    return FitData(
        X=X_arr,
        y=y_arr,
        weights=weights,
        gate_columns=gate_columns,
        group_labels=group_labels,
        grouping=None if codes is None else Grouping.of(codes),
    )
