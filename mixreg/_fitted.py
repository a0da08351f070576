"""Optional sub-results of a fit: fitted attributes that only some fits set, one record each.

Every fit sets the lines (``coef_``, ``intercept_``, ``shares_``, ...). Some also set a
mixture beside them (EM's weights and noise variances, a maximum-likelihood fit), standard
errors, a gate or the fitted groups. Each of those is one record whose field names are the
estimator's attribute names: the estimator sets a record with :meth:`FittedAttributes.set_on`
and, when it is refitted, removes every record's attributes at once
(:func:`remove_optional_results`), so no attribute of an earlier fit outlives a refit that
does not set it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._am import SolverResult
from ._em import EMResult, e_step
from ._scaling import Scaling, in_caller_units
from ._solvers import FitContext

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class FittedAttributes:
    """Fitted attributes set together; a field left None is not set."""

    def set_on(self, estimator: object) -> None:
        """Set every field that is not None as the estimator's attribute of the same name."""
        for attribute in fields(self):
            value = getattr(self, attribute.name)
            if value is not None:
                setattr(estimator, attribute.name, value)

    @classmethod
    def remove_from(cls, estimator: object) -> None:
        """Remove every attribute this record may set from the estimator."""
        for attribute in fields(cls):
            if hasattr(estimator, attribute.name):
                delattr(estimator, attribute.name)


@dataclass(frozen=True)
class MixtureFit(FittedAttributes):
    """The Gaussian mixture beside the min-loss lines: EM's weights and noise variances, or
    the maximum-likelihood fit (of a grouped ``auto`` fit, or the one the standard errors
    belong to: ``ml_start_`` then says where it started), in the caller's units."""

    weights_: FloatArray | None = None
    noise_variance_: FloatArray | None = None
    log_likelihood_: float | None = None
    ml_coef_: FloatArray | None = None
    ml_intercept_: FloatArray | None = None
    ml_start_: str | None = None


@dataclass(frozen=True)
class StandardErrors(FittedAttributes):
    """Standard errors of the maximum-likelihood fit and its covariance, in the caller's
    units; a gated fit adds its gate's."""

    coef_se_: FloatArray
    intercept_se_: FloatArray
    noise_variance_se_: FloatArray
    weights_se_: FloatArray
    covariance_: FloatArray
    gate_coef_se_: FloatArray | None = None
    gate_intercept_se_: FloatArray | None = None


@dataclass(frozen=True)
class GateFit(FittedAttributes):
    """A gated fit's gate, its noise variances and likelihood, components in the
    estimator's order (the first is the gate's reference)."""

    gate_coef_: FloatArray
    gate_intercept_: FloatArray
    weights_: FloatArray
    noise_variance_: FloatArray
    log_likelihood_history_: FloatArray
    log_likelihood_: float
    bic_: float
    gate_n_iter_: int
    gate_converged_: bool
    gate_start_: str
    gate_on_features_: bool
    n_concomitant_in_: int


@dataclass(frozen=True)
class GroupedFit(FittedAttributes):
    """The fitted groups: their labels, each one's line and, for EM, its posterior."""

    group_labels_: NDArray[Any]
    group_line_: NDArray[np.intp]
    group_posterior_: FloatArray | None = None


OPTIONAL_RESULTS: tuple[type[FittedAttributes], ...] = (
    MixtureFit,
    StandardErrors,
    GateFit,
    GroupedFit,
)


def remove_optional_results(estimator: object) -> None:
    """Remove every optional sub-result of an earlier fit from the estimator."""
    for record in OPTIONAL_RESULTS:
        record.remove_from(estimator)


def em_mixture(result: EMResult, order: NDArray[np.intp], loss_scale: float) -> MixtureFit:
    """EM's weights and noise variances, in the output order and the caller's units."""
    assert result.weights is not None and result.variances is not None
    return MixtureFit(
        weights_=result.weights[order],
        noise_variance_=in_caller_units(result.variances[order], loss_scale),
    )


def grouped_maximum_likelihood(
    mixture: EMResult,
    order: NDArray[np.intp],
    scaling: Scaling,
    observations: int | FloatArray,
) -> MixtureFit:
    """The maximum-likelihood mixture of a grouped ``auto`` fit (scaled, each line at its
    min-loss line's index) in the output order and the caller's units; ``observations``
    is the number of rows, or their weights."""
    assert mixture.weights is not None and mixture.variances is not None
    assert mixture.log_likelihood_history
    coef, intercept = scaling.to_caller(mixture.theta)
    # The density of y in the caller's units is the scaled one over y_scale, row by row.
    total = float(np.sum(observations))
    return MixtureFit(
        ml_coef_=coef[order],
        ml_intercept_=intercept[order],
        weights_=mixture.weights[order],
        noise_variance_=in_caller_units(mixture.variances[order], scaling.y_scale**2),
        log_likelihood_=total
        * (mixture.log_likelihood_history[-1] - float(np.log(scaling.y_scale))),
    )


def grouped_fit(
    ctx: FitContext,
    result: SolverResult,
    group_labels: NDArray[Any],
    row_lines: NDArray[np.intp],
    order: NDArray[np.intp],
) -> GroupedFit:
    """The fitted groups: their labels, each one's line and, for EM, its posterior."""
    assert ctx.grouping is not None
    position = np.argsort(order)
    group_line = np.zeros(ctx.grouping.n_groups, dtype=np.intp)
    group_line[ctx.grouping.codes] = position[row_lines]
    posterior = None
    if isinstance(result, EMResult):
        assert result.weights is not None and result.variances is not None
        expectation = e_step(
            ctx.Z,
            ctx.y,
            result.theta[None],
            result.weights[None],
            result.variances[None],
            sample_weight=ctx.sample_weight,
            grouping=ctx.grouping,
        )
        posterior = expectation.unit_posteriors[0][order].T
    return GroupedFit(
        group_labels_=group_labels, group_line_=group_line, group_posterior_=posterior
    )
