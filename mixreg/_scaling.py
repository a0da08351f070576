"""The fit's standardized units: features and target centred and scaled, and back.

Every algorithm works on a scaled design ``Z`` (centred, scaled features, then a column of ones
when there is an intercept) and a scaled target, so its step sizes and tolerances keep their
meaning whatever the units of the data; :class:`Scaling` maps lines, variances and losses
between those units and the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._loss import weighted_mean

FloatArray = NDArray[np.float64]

# Squared errors of larger targets overflow a float64.
MAX_ABS_Y = 1e150


def _column_extent(X: FloatArray, block_rows: int = 1 << 16) -> FloatArray:
    """Largest absolute value of every column, without a copy of X."""
    extent = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], block_rows):
        np.maximum(extent, np.abs(X[start : start + block_rows]).max(axis=0), out=extent)
    return extent


@dataclass(frozen=True)
class Scaling:
    """Standardized units: each feature centred and scaled, then the paper's scaling.

    With an intercept, each feature is centred on its mean and y on its mean (as
    scikit-learn's ``LinearRegression`` does before it solves): a feature far from zero (a
    year, a timestamp, a price) then loses no precision, and the units the algorithms see
    do not depend on the location or scale of any feature or of y, so every algorithm is
    equivariant under affine changes of the data. Each feature is divided by its standard
    deviation, then all by the largest row norm, and y by its largest absolute deviation:
    max row norm of X and max |y| are 1, as in the paper, so step sizes keep their meaning.
    """

    x_mean: FloatArray
    x_scale: FloatArray
    y_mean: float
    y_scale: float
    fit_intercept: bool

    @classmethod
    def of(
        cls,
        X: FloatArray,
        y: FloatArray,
        fit_intercept: bool,
        sample_weight: FloatArray | None = None,
    ) -> tuple[Scaling, FloatArray, FloatArray]:
        """The scaling of (X, y), with the design matrix and target in its units.

        With positive ``sample_weight``, means and standard deviations are weighted (a row
        of integer weight ``w`` counts as ``w`` copies); extents do not depend on weights.
        """
        y_extent = float(np.max(np.abs(y)))
        if y_extent > MAX_ABS_Y:
            raise ValueError(
                f"|y| reaches {y_extent:.3g}: squared errors of such values overflow a float64; "
                f"scale y down (|y| <= {MAX_ABS_Y:.0e})"
            )
        n_samples, n_features = X.shape
        # Divided by a power of two above each column's extent first (exact: no rounding is
        # added to features far from zero), so neither a sum nor a square overflows.
        _, exponent = np.frexp(_column_extent(X))
        extent = np.ldexp(1.0, np.minimum(exponent, 1023))
        Z = np.empty((n_samples, n_features + fit_intercept))
        features = Z[:, :n_features]
        np.divide(X, extent, out=features)
        x_mean = np.zeros(n_features)
        if fit_intercept:
            x_mean = (
                features.mean(axis=0)
                if sample_weight is None
                else (sample_weight @ features) / sample_weight.sum()
            )
            features -= x_mean
            Z[:, n_features] = 1.0
        if sample_weight is None:
            spread = np.sqrt(np.einsum("ij,ij->j", features, features) / n_samples)
        else:
            spread = np.sqrt(
                np.einsum("i,ij,ij->j", sample_weight, features, features) / sample_weight.sum()
            )
        spread[spread <= np.finfo(np.float64).tiny] = 1.0
        features /= spread
        row_norm = float(np.sqrt(np.max(np.einsum("ij,ij->i", features, features))))
        row_norm = row_norm if row_norm > 0.0 else 1.0
        features /= row_norm
        y_mean = float(weighted_mean(y, sample_weight)) if fit_intercept else 0.0
        y_centred = y - y_mean
        y_scale = float(np.max(np.abs(y_centred))) or 1.0
        scaling = cls(
            x_mean=x_mean * extent,
            x_scale=extent * spread * row_norm,
            y_mean=y_mean,
            y_scale=y_scale,
            fit_intercept=fit_intercept,
        )
        return scaling, Z, y_centred / y_scale

    def to_scaled(self, lines: FloatArray) -> FloatArray:
        """Caller-unit lines (coefficients then intercept) to scaled-space parameters."""
        n_features = self.x_scale.size
        theta = np.array(lines, dtype=np.float64) / self.y_scale
        if self.fit_intercept:
            theta[:, n_features] += (
                lines[:, :n_features] @ self.x_mean - self.y_mean
            ) / self.y_scale
        theta[:, :n_features] *= self.x_scale
        return theta

    def to_caller(self, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Scaled-space parameters to (coef, intercept) in the caller's units.

        Raises ValueError when a slope is beyond a float64's range (features tiny next to the
        targets): such lines cannot be written down.
        """
        n_features = self.x_scale.size
        # Multiply, then divide: y_scale / x_scale alone may overflow, and 0 * inf is NaN.
        with np.errstate(over="ignore", invalid="ignore"):
            coef = theta[:, :n_features] * self.y_scale / self.x_scale
            intercept = np.zeros(theta.shape[0])
            if self.fit_intercept:
                intercept = self.y_mean + theta[:, n_features] * self.y_scale - coef @ self.x_mean
        if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
            raise ValueError(
                f"the fitted lines overflow a float64: a feature spreads over "
                f"{float(self.x_scale.min()):.3g} while y spreads over {self.y_scale:.3g}; "
                f"scale X up or y down"
            )
        return coef, intercept

    def line_jacobian(self) -> FloatArray:
        """Derivative of one line's caller-unit (coef, intercept) in its scaled parameters
        (:meth:`to_caller` is linear in them)."""
        n_features = self.x_scale.size
        factor = self.y_scale / self.x_scale
        jacobian = np.zeros((n_features + self.fit_intercept, n_features + self.fit_intercept))
        jacobian[np.arange(n_features), np.arange(n_features)] = factor
        if self.fit_intercept:
            jacobian[n_features, :n_features] = -factor * self.x_mean
            jacobian[n_features, n_features] = self.y_scale
        return jacobian


def in_caller_units(losses: ArrayLike, loss_scale: float) -> FloatArray:
    """Scaled losses (or variances) in the caller's units. One beyond a float64's range (a
    terrible candidate on targets near ``MAX_ABS_Y``) is kept as the largest float64, a
    finite stand-in that still compares as worst."""
    with np.errstate(over="ignore"):
        values = np.asarray(losses, dtype=np.float64) * loss_scale
    return np.minimum(values, np.finfo(np.float64).max)
