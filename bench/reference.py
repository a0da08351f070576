"""Plain reference implementations, written the way the paper's pseudo-code reads.

They exist to check and to time the vectorized estimator against: a Python ``for`` loop over
the h random partitions with a scikit-learn ``LinearRegression`` or ``RANSACRegressor()`` per
part (Algorithm 3), a Python loop over the iterations of gradient AM (Algorithm 1), and the
one-line least-squares baseline. They take the same inputs as the estimator (a sub-sample A
drawn with replacement, a random part label per point of A, a seed) and draw them from
``numpy.random.default_rng(seed)`` in the order the pseudo-code reads: A, then the labels of
each partition, then (RANSAC only) a seed per fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from sklearn.linear_model import LinearRegression, RANSACRegressor

FloatArray = NDArray[np.float64]


@dataclass
class ReferenceFit:
    """Lines found by a reference algorithm.

    Attributes
    ----------
    coef : ndarray of shape (n_components, n_features)
    intercept : ndarray of shape (n_components,)
    loss_history : list of float
        Training min-loss: per iteration (AM) or of each improving candidate (sub-sample).
    n_candidates : int
        Random partitions scored (sub-sample only).
    """

    coef: FloatArray
    intercept: FloatArray
    loss_history: list[float] = field(default_factory=list)
    n_candidates: int = 0

    def predict(self, X: FloatArray) -> FloatArray:
        """One prediction per line, shape (n_samples, n_components)."""
        return reference_predict(X, self.coef, self.intercept)

    def min_loss(self, X: FloatArray, y: FloatArray) -> float:
        """The paper's min-loss of these lines on (X, y)."""
        return reference_min_loss(y, self.predict(X))


def reference_predict(X: FloatArray, coef: FloatArray, intercept: FloatArray) -> FloatArray:
    """Predictions of every line: column j is ``X @ coef[j] + intercept[j]``."""
    return np.column_stack([X @ coef[j] + intercept[j] for j in range(coef.shape[0])])


def reference_min_loss(y: FloatArray, predictions: FloatArray) -> float:
    """``(1/n) sum_i min_j (y_i - predictions[i, j])^2``."""
    squared_errors = (y[:, None] - predictions) ** 2
    return float(np.mean(np.min(squared_errors, axis=1)))


def reference_least_squares(
    X: FloatArray, y: FloatArray, fit_intercept: bool = True
) -> ReferenceFit:
    """The one-line baseline: ordinary least squares on all rows."""
    model = LinearRegression(fit_intercept=fit_intercept).fit(X, y)
    return ReferenceFit(
        coef=np.atleast_2d(model.coef_).astype(np.float64),
        intercept=np.array([model.intercept_], dtype=np.float64),
    )


def _fit_line(
    X: FloatArray, y: FloatArray, base: str, fit_intercept: bool, rng: np.random.Generator
) -> tuple[FloatArray, float]:
    """Fit one line with the base model; return its coefficients and intercept.

    ``RANSACRegressor`` keeps its defaults; only the inner model's intercept and a seed drawn
    from ``rng`` are set. It refuses fewer rows than its ``min_samples`` (d + 1); such a part
    gets ordinary least squares instead.
    """
    if base == "ransac" and X.shape[0] >= X.shape[1] + 1:
        ransac = RANSACRegressor(
            estimator=LinearRegression(fit_intercept=fit_intercept),
            random_state=int(rng.integers(0, 2**31 - 1)),
        ).fit(X, y)
        fitted = ransac.estimator_
    else:
        fitted = LinearRegression(fit_intercept=fit_intercept).fit(X, y)
    return np.asarray(fitted.coef_, dtype=np.float64), float(fitted.intercept_)


def reference_subsample(
    X: FloatArray,
    y: FloatArray,
    n_components: int,
    *,
    subsample_size: int = 150,
    n_partitions: int = 1000,
    base: str = "ls",
    fit_intercept: bool = True,
    random_state: int | None = None,
) -> ReferenceFit:
    """Algorithm 3: h random partitions of a sub-sample, a line per part, keep the best.

    1. Draw A: ``subsample_size`` row indices uniformly with replacement.
    2. For each of ``n_partitions`` partitions (each point of A gets a uniform random part):
       fit the base model on each part, predict every row with every line, score the
       candidate by its min-loss on all rows. A partition with an empty part is skipped.
    3. Keep the best candidate; refit each of its lines, with the same base model, on the
       rows it predicts best. A line that wins fewer than 2 rows keeps its candidate value.
    """
    if base not in ("ls", "ransac"):
        raise ValueError(f"base must be 'ls' or 'ransac', got {base!r}.")
    rng = np.random.default_rng(random_state)
    n_samples = X.shape[0]
    subsample = rng.integers(0, n_samples, size=subsample_size)
    X_a, y_a = X[subsample], y[subsample]

    best_loss = np.inf
    best_coef = np.zeros((n_components, X.shape[1]))
    best_intercept = np.zeros(n_components)
    history: list[float] = []
    for _ in range(n_partitions):
        part_of_point = rng.integers(0, n_components, size=subsample_size)
        if np.unique(part_of_point).size < n_components:
            continue
        coef = np.zeros((n_components, X.shape[1]))
        intercept = np.zeros(n_components)
        for j in range(n_components):
            in_part = part_of_point == j
            coef[j], intercept[j] = _fit_line(X_a[in_part], y_a[in_part], base, fit_intercept, rng)
        loss = reference_min_loss(y, reference_predict(X, coef, intercept))
        if loss < best_loss:
            best_loss, best_coef, best_intercept = loss, coef, intercept
            history.append(loss)

    winner = np.argmin((y[:, None] - reference_predict(X, best_coef, best_intercept)) ** 2, axis=1)
    coef, intercept = best_coef.copy(), best_intercept.copy()
    for j in range(n_components):
        wins = winner == j
        if wins.sum() >= 2:
            coef[j], intercept[j] = _fit_line(X[wins], y[wins], base, fit_intercept, rng)
    return ReferenceFit(
        coef=coef, intercept=intercept, loss_history=history, n_candidates=n_partitions
    )


def reference_gradient_am(
    X: FloatArray,
    y: FloatArray,
    n_components: int,
    *,
    step_size: float = 0.1,
    max_iter: int = 100,
    tol: float = 1e-6,
    init: FloatArray | None = None,
    fit_intercept: bool = True,
    random_state: int | None = None,
) -> ReferenceFit:
    """Algorithm 1: assign every row to its best line, then one gradient step per line.

    The data are put in the estimator's standardized units: with an intercept each feature
    and the target are centred on their means; each feature is divided by its standard
    deviation, then all features by the largest row norm, and the target by its largest
    absolute value, so that the step size has the paper's meaning; with an intercept a
    constant feature 1 is appended after scaling. The lines are reported in the caller's units.

    ``theta_j <- theta_j - (step_size / n) * sum_{i in S_j} grad F_i(theta_j)`` with
    ``F_i(theta) = (y_i - <z_i, theta>)^2``; stops after ``max_iter`` steps or when the
    min-loss changes by at most ``tol`` (relative).

    ``init`` is (n_components, n_features + 1) in the caller's units (coefficients, then the
    intercept; without an intercept (n_components, n_features)). Without ``init`` every
    entry of the scaled lines is drawn from a standard normal.
    """
    rng = np.random.default_rng(random_state)
    n_samples, n_features = X.shape
    x_mean = X.mean(axis=0) if fit_intercept else np.zeros(n_features)
    centred = X - x_mean
    spread = np.sqrt(np.mean(centred**2, axis=0))
    spread[spread <= np.finfo(np.float64).tiny] = 1.0
    row_norm = float(np.max(np.linalg.norm(centred / spread, axis=1))) or 1.0
    x_scale = spread * row_norm
    Z = centred / x_scale
    if fit_intercept:
        Z = np.column_stack([Z, np.ones(n_samples)])
    y_mean = float(np.mean(y)) if fit_intercept else 0.0
    y_scale = float(np.max(np.abs(y - y_mean))) or 1.0
    target = (y - y_mean) / y_scale

    if init is None:
        theta = rng.standard_normal((n_components, Z.shape[1]))
    else:
        lines = np.array(init, dtype=np.float64)
        theta = lines / y_scale
        if fit_intercept:
            theta[:, n_features] += (lines[:, :n_features] @ x_mean - y_mean) / y_scale
        theta[:, :n_features] *= x_scale

    history: list[float] = []
    for _ in range(max_iter + 1):
        residuals = target[:, None] - Z @ theta.T
        best_line = np.argmin(residuals**2, axis=1)
        history.append(float(np.mean(np.min(residuals**2, axis=1))) * y_scale**2)
        if len(history) > 1 and abs(history[-2] - history[-1]) <= tol * history[-2]:
            break
        if len(history) == max_iter + 1:
            break
        for j in range(n_components):
            rows = best_line == j
            gradient = -2.0 * Z[rows].T @ residuals[rows, j]
            theta[j] = theta[j] - step_size / n_samples * gradient

    coef = theta[:, :n_features] * y_scale / x_scale
    intercept = np.zeros(n_components)
    if fit_intercept:
        intercept = y_mean + theta[:, n_features] * y_scale - coef @ x_mean
    return ReferenceFit(coef=coef, intercept=intercept, loss_history=history)
