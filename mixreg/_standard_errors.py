"""Standard errors of a fit: the maximum-likelihood fit they belong to, its observed
information and the covariance in the caller's units, as the estimator's attributes.

The information itself is computed in :mod:`mixreg._inference` (a mixture) and
:mod:`mixreg._gated_inference` (a gated mixture); this module assembles their results into
:class:`~mixreg._fitted.MixtureFit` and :class:`~mixreg._fitted.StandardErrors` records.
"""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import NDArray

from ._fitted import MixtureFit, StandardErrors
from ._gate_fit import GatedFit
from ._gated_inference import GatedParameters, gated_caller_jacobian, gated_likelihood_pass
from ._inference import caller_jacobian, covariance_from_information, likelihood_pass
from ._likelihood import best_maximum_likelihood
from ._scaling import Scaling, in_caller_units
from ._solvers import FitContext

FloatArray = NDArray[np.float64]


class StandardErrorWarning(UserWarning):
    """The standard errors of a fit do not exist (its observed information is singular)."""


def covariance_or_nan(information: FloatArray, jacobian: FloatArray) -> FloatArray:
    """The covariance in the caller's units, or NaN (with a warning) where the observed
    information is singular."""
    scaled_covariance = covariance_from_information(information)
    if scaled_covariance is None:
        warnings.warn(
            "the observed information of the mixture is singular at its maximum-likelihood "
            "fit (a line owns almost no rows, or two lines coincide): its standard errors "
            "do not exist and are NaN; fit fewer lines (n_components)",
            StandardErrorWarning,
            stacklevel=4,
        )
        return np.full((jacobian.shape[0],) * 2, np.nan)
    covariance: FloatArray = jacobian @ scaled_covariance @ jacobian.T
    return covariance


def _line_errors(
    by_line: FloatArray, n_features: int, fit_intercept: bool
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Each line's coefficients', intercept's and noise variance's errors, from the rows of
    ``by_line`` (per line: coefficients, intercept when fitted, noise variance)."""
    intercept_se = by_line[:, n_features] if fit_intercept else np.zeros(by_line.shape[0])
    return by_line[:, :n_features], intercept_se, by_line[:, -1]


def mixture_standard_errors(
    ctx: FitContext, theta: FloatArray, scaling: Scaling, n_features: int, fit_intercept: bool
) -> tuple[MixtureFit, StandardErrors]:
    """The maximum-likelihood fit at the highest maximum found from ``theta`` (scaled lines,
    in the output order), EM restarts and flexmix-like random partitions
    (:func:`~mixreg._likelihood.best_maximum_likelihood`), and its standard errors, in the
    caller's units; rows count the fit's sample weights times."""
    Z, y, sample_weight = ctx.Z, ctx.y, ctx.sample_weight
    fit = best_maximum_likelihood(Z, y, theta, rng=ctx.rng, sample_weight=sample_weight)
    params = fit.params
    evaluated = (
        likelihood_pass(Z, y, params, sample_weight=sample_weight)
        if fit.at_maximum is None
        else fit.at_maximum
    )
    variance_scale = scaling.y_scale**2
    coef, intercept = scaling.to_caller(params.theta)
    # The density of y in the caller's units is the scaled one over y_scale, row by row.
    n_observations = y.size if sample_weight is None else float(sample_weight.sum())
    mixture = MixtureFit(
        ml_coef_=coef,
        ml_intercept_=intercept,
        ml_start_=fit.start,
        weights_=params.weights,
        noise_variance_=in_caller_units(params.variances, variance_scale),
        log_likelihood_=evaluated.log_likelihood - n_observations * np.log(scaling.y_scale),
    )
    jacobian = caller_jacobian(params, scaling.line_jacobian(), variance_scale)
    covariance = covariance_or_nan(evaluated.information, jacobian)
    k = coef.shape[0]
    n_line = theta.shape[1] + 1
    se = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    coef_se, intercept_se, noise_variance_se = _line_errors(
        se[: k * n_line].reshape(k, n_line), n_features, fit_intercept
    )
    errors = StandardErrors(
        coef_se_=coef_se,
        intercept_se_=intercept_se,
        noise_variance_se_=noise_variance_se,
        weights_se_=se[k * n_line :],
        covariance_=covariance,
    )
    return mixture, errors


def gate_standard_errors(
    gate: GatedFit,
    order: NDArray[np.intp],
    ctx: FitContext,
    scaling: Scaling,
    *,
    coef: FloatArray,
    intercept: FloatArray,
    fit_intercept: bool,
) -> tuple[MixtureFit, StandardErrors]:
    """Standard errors of a gated fit (its lines ``coef`` and ``intercept``, noise variances
    and gate, at the maximum :func:`~mixreg._gate_fit.finish_gate` reached) from the gated
    mixture's observed information, in the caller's units; the mixture weights, the gate's
    mean probabilities, have none."""
    beta = gate.em.beta[order]
    params = GatedParameters(
        theta=gate.em.theta[order], variances=gate.em.variances[order], beta=beta - beta[0]
    )
    evaluated = gated_likelihood_pass(ctx.Z, ctx.y, gate.design, params)
    variance_scale = scaling.y_scale**2
    jacobian = gated_caller_jacobian(params, scaling.line_jacobian(), variance_scale, gate.scaling)
    covariance = covariance_or_nan(evaluated.information, jacobian)
    k, n_params = params.theta.shape
    n_line = n_params + 1
    se = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    coef_se, intercept_se, noise_variance_se = _line_errors(
        se[: k * n_line].reshape(k, n_line), coef.shape[1], fit_intercept
    )
    # The reference row is fixed at zero: no error.
    by_row = np.zeros((k, gate.design.shape[1]))
    by_row[1:] = se[k * n_line :].reshape(k - 1, gate.design.shape[1])
    errors = StandardErrors(
        coef_se_=coef_se,
        intercept_se_=intercept_se,
        noise_variance_se_=noise_variance_se,
        weights_se_=np.full(k, np.nan),
        covariance_=covariance,
        gate_coef_se_=by_row[:, :-1],
        gate_intercept_se_=by_row[:, -1],
    )
    return MixtureFit(ml_coef_=coef, ml_intercept_=intercept), errors
