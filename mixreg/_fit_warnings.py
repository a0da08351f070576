"""Warnings a fit raises after it ends: lines that own too few rows, iterations that ran out.

Each message says what to change (``n_components``, ``max_iter``, ``tol``, ``step_size``).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.exceptions import ConvergenceWarning

from ._am import SolverResult
from ._em import EMResult

FloatArray = NDArray[np.float64]


class DegenerateFitWarning(UserWarning):
    """Some fitted lines own too few training rows to be estimated (a degenerate fit)."""


def minimum_rows_per_line(n_params: int) -> int:
    """Rows a line must own: one more than its coefficients, so its noise has a residual."""
    return n_params + 1


def warn_if_degenerate(rows_per_line: FloatArray, n_params: int) -> None:
    """Warn when a line owns fewer rows than its coefficients need, plus one for its noise."""
    needed = minimum_rows_per_line(n_params)
    owned = np.rint(rows_per_line).astype(int)
    few = np.flatnonzero(owned < needed)
    if few.size == 0:
        return
    k = owned.size
    warnings.warn(
        f"{few.size} of the {k} lines own fewer than the {needed} training rows a line with "
        f"{n_params} coefficients needs (they own {', '.join(str(owned[j]) for j in few)} "
        f"rows): such lines fit a handful of rows exactly and say nothing about new ones; "
        f"fit fewer lines (n_components) or give more rows (at least {k * needed} for "
        f"{k} lines)",
        DegenerateFitWarning,
        stacklevel=2,
    )


def warn_if_unconverged(
    algorithm: str, result: SolverResult, params: dict[str, Any], deadline: float | None
) -> None:
    """Warn, saying what to change, when ``max_iter`` (not the time budget) stopped the fit."""
    max_iter = params.get("max_iter")
    if result.converged or max_iter is None or result.n_iter < max_iter:
        return
    if params["tol"] == 0:
        # tol=0 asks for exactly max_iter iterations (the paper's fixed T).
        return
    if deadline is not None and time.monotonic() > deadline:
        return
    history, quantity = result.loss_history, "min-loss"
    change = abs(history[-2] - history[-1]) / max(abs(history[-2]), np.finfo(float).tiny)
    how = "relative"
    if isinstance(result, EMResult) and result.log_likelihood_history:
        history, quantity = result.log_likelihood_history, "mean log-likelihood per row"
        change, how = abs(history[-2] - history[-1]), "absolute"
    what = {
        "auto": "the polish of the best candidate by classical AM",
        "em": "EM",
        "am-classic": "classical AM",
    }.get(algorithm, "gradient AM")
    advice = f"raise max_iter (now {max_iter})"
    if algorithm in ("am", "subsample+am") and params.get("step_size") != "auto":
        advice += ", or use step_size='auto'"
    elif algorithm == "em":
        advice += f" or tol (now {params['tol']:g})"
    warnings.warn(
        f"{what} stopped at max_iter={max_iter} before converging: the {quantity} still changed "
        f"by {change:.2g} ({how}) in the last iteration, above tol={params['tol']:g}; "
        f"{advice}",
        ConvergenceWarning,
        stacklevel=3,
    )
