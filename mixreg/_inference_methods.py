"""The estimator's inference methods: Wald intervals, R-like summaries and the bootstrap.

They read the maximum-likelihood fit and standard errors that ``fit(standard_errors=True)``
leaves on the estimator (:mod:`mixreg._standard_errors`); the bootstrap refits resampled data
(:mod:`mixreg._bootstrap`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.exceptions import NotFittedError

from ._bootstrap import BootstrapResult, bootstrap_fit
from ._inference import check_level, normal_quantile
from ._summary import InferenceSummary, gate_summary_rows, summary_table
from ._validation import as_generator, check_X, check_X_y

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]


class InferenceMethods:
    """Intervals, summaries and the bootstrap of a fitted mixture (a base of the estimator)."""

    # What the methods read from the estimator: its parameters and fitted attributes.
    fit_intercept: bool
    n_features_in_: int
    coef_: FloatArray
    intercept_: FloatArray
    ml_coef_: FloatArray
    ml_intercept_: FloatArray
    weights_: FloatArray
    noise_variance_: FloatArray
    log_likelihood_: float
    coef_se_: FloatArray
    intercept_se_: FloatArray
    weights_se_: FloatArray
    noise_variance_se_: FloatArray
    gate_coef_: FloatArray
    gate_intercept_: FloatArray
    gate_coef_se_: FloatArray
    gate_intercept_se_: FloatArray
    gate_on_features_: bool
    bootstrap_: BootstrapResult
    # The estimator's check that it is fitted (NotFittedError otherwise).
    _check_fitted: Callable[[], None]

    def _check_standard_errors(self) -> None:
        self._check_fitted()
        if not hasattr(self, "coef_se_"):
            raise NotFittedError(
                "This MixtureOfLinearRegressions has no standard errors; fit it with "
                "standard_errors=True."
            )

    def confidence_intervals(self, level: float = 0.95) -> dict[str, FloatArray]:
        """Wald intervals ``estimate -/+ z_(1+level)/2 * se`` of the maximum-likelihood fit.

        Returns
        -------
        intervals : dict
            ``coef`` of shape (n_components, n_features, 2), ``intercept``, ``weights`` and
            ``noise_variance`` of shape (n_components, 2): lower and upper bounds (NaN where
            the standard error does not exist: the weights of a gated fit, its gate's mean
            probabilities, have none). A gated fit adds ``gate_coef`` of shape
            (n_components, n_concomitant, 2) and ``gate_intercept`` of shape
            (n_components, 2); the reference component's are (0, 0).
        """
        self._check_standard_errors()
        critical = normal_quantile(check_level(level))
        pairs = {
            "coef": (self.ml_coef_, self.coef_se_),
            "intercept": (self.ml_intercept_, self.intercept_se_),
            "weights": (self.weights_, self.weights_se_),
            "noise_variance": (self.noise_variance_, self.noise_variance_se_),
        }
        if hasattr(self, "gate_coef_se_"):
            pairs["gate_coef"] = (self.gate_coef_, self.gate_coef_se_)
            pairs["gate_intercept"] = (self.gate_intercept_, self.gate_intercept_se_)
        return {
            name: np.stack([estimate - critical * se, estimate + critical * se], axis=-1)
            for name, (estimate, se) in pairs.items()
        }

    def summary(
        self,
        level: float = 0.95,
        feature_names: Sequence[str] | None = None,
        concomitant_names: Sequence[str] | None = None,
    ) -> InferenceSummary:
        """Per line, estimate, std. error, z value, Pr(>|z|) and interval of every coefficient
        (as R's ``summary(refit(m))``), then of its weight and noise variance; for a gated fit
        also the gate's rows (``gate_rows``), as R lists a concomitant model. ``str()`` of the
        result prints it as R does. ``concomitant_names`` names the columns of a gate fitted
        on ``concomitant`` (a gate on the features takes ``feature_names``)."""
        self._check_standard_errors()
        names = (
            [f"x{column}" for column in range(self.n_features_in_)]
            if feature_names is None
            else [str(name) for name in feature_names]
        )
        if len(names) != self.n_features_in_:
            raise ValueError(
                f"feature_names has {len(names)} names for {self.n_features_in_} features"
            )
        table = summary_table(
            feature_names=names,
            fit_intercept=bool(self.fit_intercept),
            coef=self.ml_coef_,
            intercept=self.ml_intercept_,
            weights=self.weights_,
            noise_variance=self.noise_variance_,
            coef_se=self.coef_se_,
            intercept_se=self.intercept_se_,
            weights_se=self.weights_se_,
            noise_variance_se=self.noise_variance_se_,
            level=check_level(level),
            log_likelihood=float(self.log_likelihood_),
        )
        if not hasattr(self, "gate_coef_se_"):
            return replace(table, start=getattr(self, "ml_start_", None))
        n_columns = self.gate_coef_.shape[1]
        if self.gate_on_features_:
            gate_names = names
        elif concomitant_names is None:
            gate_names = [f"z{column}" for column in range(n_columns)]
        else:
            gate_names = [str(name) for name in concomitant_names]
        if len(gate_names) != n_columns:
            raise ValueError(
                f"concomitant_names has {len(gate_names)} names for the gate's {n_columns} columns"
            )
        return replace(
            table,
            gate_rows=gate_summary_rows(
                concomitant_names=gate_names,
                gate_coef=self.gate_coef_,
                gate_intercept=self.gate_intercept_,
                gate_coef_se=self.gate_coef_se_,
                gate_intercept_se=self.gate_intercept_se_,
                level=table.level,
            ),
        )

    def bootstrap(
        self,
        X: ArrayLike,
        y: ArrayLike,
        n_bootstrap: int = 200,
        kind: str = "parametric",
        random_state: Any = None,
        level: float = 0.95,
        progress: ProgressCallback | None = None,
    ) -> BootstrapResult:
        """Bootstrap standard errors and percentile intervals of the maximum-likelihood fit.

        The fitted lines are polished to the maximum-likelihood fit (as for
        ``standard_errors``); each of ``n_bootstrap`` replicates (``kind="parametric"``: new
        targets drawn from that mixture at the same rows; ``"empirical"``: rows drawn with
        replacement) is refitted by EM from it, and its lines are matched to the fitted ones by
        the Hungarian assignment on their parameters, so line j of every replicate is line j.

        Parameters
        ----------
        X, y : the training data
        progress : callable, optional
            ``progress(fraction, info)`` after every replicate (``info["iteration"]`` is the
            number of replicates done); an exception raised by it stops the bootstrap.

        Returns
        -------
        BootstrapResult
            Also kept as ``bootstrap_``.
        """
        self._check_fitted()
        if (
            isinstance(n_bootstrap, bool)
            or not isinstance(n_bootstrap, numbers.Integral)
            or n_bootstrap < 2
        ):
            raise ValueError(f"n_bootstrap must be an integer >= 2; got {n_bootstrap!r}")
        level = check_level(level)
        X_arr, y_arr = check_X_y(X, y)
        check_X(X_arr, n_features=self.n_features_in_)
        lines = np.column_stack([self.coef_, self.intercept_]) if self.fit_intercept else self.coef_
        maximum_likelihood = None
        if hasattr(self, "ml_coef_") and hasattr(self, "ml_start_"):
            # The maximum-likelihood fit the standard errors belong to.
            ml_lines = (
                np.column_stack([self.ml_coef_, self.ml_intercept_])
                if self.fit_intercept
                else self.ml_coef_
            )
            maximum_likelihood = (ml_lines, self.weights_, self.noise_variance_)
        self.bootstrap_ = bootstrap_fit(
            X_arr,
            y_arr,
            lines,
            fit_intercept=bool(self.fit_intercept),
            maximum_likelihood=maximum_likelihood,
            n_bootstrap=int(n_bootstrap),
            kind=kind,
            level=level,
            new_generator=lambda: as_generator(random_state),
            progress=progress,
        )
        return self.bootstrap_
