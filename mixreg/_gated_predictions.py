"""The estimator's methods for a gated model: mixing probabilities of each row from the gate,
gate-weighted and most likely predictions, and the gated log-likelihood of new rows."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._gate import gated_log_densities, log_softmax
from ._loss import predict_lines
from ._validation import check_concomitant, check_sample_weight, check_X, check_X_y

FloatArray = NDArray[np.float64]


class GatedPredictions:
    """Predictions of a gated fit (a base of the estimator)."""

    # What the methods read from the estimator: its fitted lines and gate.
    n_features_in_: int
    coef_: FloatArray
    intercept_: FloatArray
    noise_variance_: FloatArray
    gate_coef_: FloatArray
    gate_intercept_: FloatArray
    gate_on_features_: bool
    n_concomitant_in_: int
    # The estimator's check that it is fitted (NotFittedError otherwise).
    _check_fitted: Callable[[], None]

    def _gate_columns(self, X: FloatArray, Z: ArrayLike | None) -> FloatArray:
        """The columns the gate reads for rows ``X``: the features, or the checked ``Z``."""
        if not hasattr(self, "gate_coef_"):
            raise ValueError(
                "this model has no gate: fit it with gating=True for mixing probabilities "
                "that depend on each row"
            )
        if self.gate_on_features_:
            if Z is not None:
                raise ValueError(
                    "this model's gate reads the features: pass no concomitant columns (Z)"
                )
            return X
        if Z is None:
            raise ValueError(
                f"this model's gate reads {self.n_concomitant_in_} concomitant columns: pass "
                f"them as Z"
            )
        return check_concomitant(Z, n_samples=X.shape[0], n_columns=self.n_concomitant_in_)

    def _lines_and_gate(self, X: ArrayLike, Z: ArrayLike | None) -> tuple[FloatArray, FloatArray]:
        """Every line's value (n, k) and the log mixing probabilities (n, k) of rows X."""
        self._check_fitted()
        X_arr = check_X(X, n_features=self.n_features_in_)
        columns = self._gate_columns(X_arr, Z)
        log_probabilities = log_softmax(columns @ self.gate_coef_.T + self.gate_intercept_)
        return predict_lines(X_arr, self.coef_, self.intercept_), log_probabilities

    def predict_proba(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The gate's mixing probabilities of every line for every row (gated models).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        Z : array-like of shape (n_samples, n_concomitant), optional
            The concomitant columns, when the gate was fitted on them.

        Returns
        -------
        probabilities : ndarray of shape (n_samples, n_components)
            Rows sum to 1.
        """
        _, log_probabilities = self._lines_and_gate(X, Z)
        return np.exp(log_probabilities)

    def predict_expected(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The gate-weighted mean of the k lines' values: ``sum_j pi_j(z) <x, coef_j> + b_j``.

        Returns
        -------
        expected : ndarray of shape (n_samples,)
        """
        values, log_probabilities = self._lines_and_gate(X, Z)
        expected: FloatArray = np.einsum("ij,ij->i", values, np.exp(log_probabilities))
        return expected

    def most_likely_component(self, X: ArrayLike, Z: ArrayLike | None = None) -> NDArray[np.intp]:
        """Index of the line of largest mixing probability for each row (ties to the lowest)."""
        _, log_probabilities = self._lines_and_gate(X, Z)
        most_likely: NDArray[np.intp] = np.argmax(log_probabilities, axis=1)
        return most_likely

    def predict_most_likely(self, X: ArrayLike, Z: ArrayLike | None = None) -> FloatArray:
        """The value of each row's most likely line (see :meth:`most_likely_component`).

        Returns
        -------
        most_likely : ndarray of shape (n_samples,)
        """
        values, log_probabilities = self._lines_and_gate(X, Z)
        chosen = np.argmax(log_probabilities, axis=1)
        most_likely: FloatArray = values[np.arange(values.shape[0]), chosen]
        return most_likely

    def gated_log_likelihood(
        self,
        X: ArrayLike,
        y: ArrayLike,
        Z: ArrayLike | None = None,
        sample_weight: ArrayLike | None = None,
    ) -> float:
        """Total log-likelihood of (X, y) under the gated mixture (held-out rows, for instance).

        ``sum_i w_i log sum_j pi_j(z_i) N(y_i; <x_i, coef_j> + intercept_j, noise_variance_j)``,
        with every ``w_i = 1`` without ``sample_weight``.
        """
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        X_arr = check_X(X_arr, n_features=self.n_features_in_)
        columns = self._gate_columns(X_arr, Z)
        ones = np.ones((X_arr.shape[0], 1))
        _, row_log_likelihood = gated_log_densities(
            np.hstack([X_arr, ones]),
            y_arr,
            np.hstack([columns, ones]),
            np.column_stack([self.coef_, self.intercept_]),
            self.noise_variance_,
            np.column_stack([self.gate_coef_, self.gate_intercept_]),
        )
        if sample_weight is None:
            return float(row_log_likelihood.sum())
        return float(row_log_likelihood @ check_sample_weight(sample_weight, len(y_arr)))
