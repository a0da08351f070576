"""What a fit's quadratic arrays would take in its process, checked when it is submitted.

Most of a fit's memory grows with its rows (bounded by the data limits) and is streamed in
blocks. Two arrays grow with the square of the parameters instead, whatever the rows:

- standard errors (and a gated fit's Newton finish that precedes them) hold the information
  matrix of every parameter, ``N = k (d + 2) + (k - 1) (q + 1)`` (lines with intercepts and
  variances, then the gate's free rows, or the k - 1 mixing logits without a gate), together
  with its eigen-decomposition and inverse: measured at about 8.6 ``N x N`` float64 matrices
  at the peak, counted as :data:`INFORMATION_MATRICES`;
- a gate's Newton steps hold the Hessian of its ``H = (k - 1) (q + 1)`` free parameters, per
  start (:data:`GATED_STARTS`), with its solve.

k = 40 lines of 1,000 features with standard errors is a 40,119-parameter information matrix,
12.9 GB each: a fit that cannot end. Such a fit is refused (422 naming the product and
``MIXREG_FIT_MEMORY_BYTES``) before it is queued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.errors import LimitExceededError

if TYPE_CHECKING:
    from service.jobs.fit_spec import FitSpec

FLOAT_BYTES = 8
INFORMATION_MATRICES = 10
"""``N x N`` matrices the standard errors hold at their peak (8.6 measured, and a margin)."""
GATE_HESSIAN_MATRICES = 4
"""``H x H`` matrices per start of the gate's Newton step (the Hessian, its damped copy, the
solve's factor and workspace)."""
GATED_STARTS = 2
"""Gated EM runs from the fitted lines and from the best EM restart, stacked."""
AUTO_STANDARD_ERRORS_MAX_BYTES = 256 * 1024 * 1024
"""Standard errors nobody asked for (``standard_errors`` left out) are computed only where
their matrices take at most this: where they cost a small share of the fit."""


def information_parameters(
    n_components: int, n_features: int, *, fit_intercept: bool, gate_columns: int | None
) -> int:
    """Parameters of the information matrix: per line its coefficients (and intercept) and
    variance, then the gate's free rows on ``gate_columns`` columns and a constant (without a
    gate: the k - 1 mixing logits)."""
    line = n_features + int(fit_intercept) + 1
    free = n_components - 1
    return n_components * line + free * (1 if gate_columns is None else gate_columns + 1)


def information_bytes(
    n_components: int, n_features: int, *, fit_intercept: bool, gate_columns: int | None
) -> int:
    """Bytes the standard errors of such a fit hold at their peak."""
    parameters = information_parameters(
        n_components, n_features, fit_intercept=fit_intercept, gate_columns=gate_columns
    )
    return INFORMATION_MATRICES * parameters * parameters * FLOAT_BYTES


def _gate_columns(spec: FitSpec, n_features: int) -> int | None:
    if spec.gating is None:
        return None
    return n_features if isinstance(spec.gating, str) else len(spec.gating)


def _size(n_bytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n_bytes < 1024 or unit == "TiB":
            return f"{n_bytes:,.0f} {unit}" if unit == "bytes" else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1024
    raise AssertionError  # the loop returns


def check_fit_memory(spec: FitSpec, *, n_features: int, fit_memory_bytes: int | None) -> None:
    """Raise ``LimitExceededError`` (422) if the largest k of ``spec`` on ``n_features``
    features needs more than ``fit_memory_bytes`` for its quadratic arrays (None: no bound).

    Counted: the information matrix when standard errors are asked for (or a bootstrap, which
    starts from them), and the gate's Hessians of a gated fit.
    """
    if fit_memory_bytes is None:
        return
    k = max(spec.all_n_components)
    gate_columns = _gate_columns(spec, n_features)
    errors: list[dict[str, Any]] = []
    limit = f"more than a fit process may use (MIXREG_FIT_MEMORY_BYTES = {fit_memory_bytes:,})"
    if spec.standard_errors is True or spec.n_bootstrap > 0:
        parameters = information_parameters(
            k, n_features, fit_intercept=spec.fit_intercept, gate_columns=gate_columns
        )
        needed = information_bytes(
            k, n_features, fit_intercept=spec.fit_intercept, gate_columns=gate_columns
        )
        if needed > fit_memory_bytes:
            gate = "" if gate_columns is None else f" and a gate on {gate_columns} columns"
            field = "standard_errors" if spec.standard_errors is True else "n_bootstrap"
            errors.append(
                {
                    "loc": ["body", field],
                    "msg": f"{field} for k={k} lines of {n_features} features{gate} need the "
                    f"information matrix of {parameters:,} parameters: {INFORMATION_MATRICES} "
                    f"x {parameters:,}² x {FLOAT_BYTES} bytes = {_size(needed)}, {limit}; "
                    f"lower k or the features, or fit without {field}",
                    "type": "limit_exceeded",
                }
            )
    if gate_columns is not None and k > 1:
        width = (k - 1) * (gate_columns + 1)
        needed = GATED_STARTS * GATE_HESSIAN_MATRICES * width * width * FLOAT_BYTES
        if needed > fit_memory_bytes:
            errors.append(
                {
                    "loc": ["body", "gating"],
                    "msg": f"a gate of k={k} classes on {gate_columns} columns has "
                    f"{width:,} free parameters; its Newton steps need "
                    f"{GATED_STARTS * GATE_HESSIAN_MATRICES} x {width:,}² x {FLOAT_BYTES} "
                    f"bytes = {_size(needed)}, {limit}; lower k or gate on fewer columns",
                    "type": "limit_exceeded",
                }
            )
    if errors:
        raise LimitExceededError("; ".join(error["msg"] for error in errors), errors=errors)
