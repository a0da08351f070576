"""A gated fit's assembly: gated EM from the fitted lines, Newton's finish, the gate's attributes.

The gate's math (its scaling, softmax, Newton M-step and gated EM) is in :mod:`mixreg._gate`;
this module runs it on a fit's scaled data and turns its result into the estimator's
attributes (:class:`~mixreg._fitted.GateFit`) in the caller's units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._em import em_batch
from ._fitted import GateFit
from ._gate import GatedEMResult, GateScaling, gated_em_batch, log_gate
from ._gated_inference import GatedParameters, gated_maximum_likelihood
from ._loss import weighted_mean
from ._scaling import Scaling, in_caller_units
from ._solvers import FitContext, random_partition_lines

FloatArray = NDArray[np.float64]

# Gated EM stops when the mean log-likelihood per row changes by at most this, or after so many
# iterations; noise variances are floored at a tiny fraction of var(y) so that a line through a
# handful of rows cannot make the likelihood unbounded.
_GATE_TOL = 1e-8
_GATE_MAX_ITER = 1000
_GATE_VARIANCE_FLOOR = 1e-8
# EM restarts from random partitions of the rows whose best (by likelihood, each stopped when its
# mean log-likelihood per row changes by at most the tolerance) is gated EM's second start.
_GATE_EM_RESTARTS = 5
_GATE_RESTART_TOL = 1e-4


@dataclass(frozen=True)
class GatedFit:
    """Gated EM's result with the gate's design and scaling (standardized units)."""

    em: GatedEMResult
    scaling: GateScaling
    design: FloatArray
    start: str
    """``"lines"`` (the algorithm's) or ``"em restart"``: where the kept gated EM started."""


def fit_gate(ctx: FitContext, columns: FloatArray, theta: FloatArray) -> GatedFit:
    """Gated EM from the fitted lines and from the best of a batch of EM restarts, in the
    fit's scaled units; the start that ends with the higher likelihood is kept."""
    scaling, design = GateScaling.of(columns, ctx.sample_weight)
    floor = _GATE_VARIANCE_FLOOR * float(np.var(ctx.y)) + np.finfo(np.float64).tiny
    # The lowest min-loss lines need not lie near the likelihood's highest maximum (a line
    # through the rows two components share fits them well but explains neither): EM
    # restarts from random partitions, as flexmix starts, give a second start.
    restarts = em_batch(
        ctx.Z,
        ctx.y,
        random_partition_lines(ctx, _GATE_EM_RESTARTS),
        max_iter=_GATE_MAX_ITER,
        tol=_GATE_RESTART_TOL,
        deadline=ctx.deadline,
        variance_floor=floor,
        sample_weight=ctx.sample_weight,
    )
    best_restart = int(np.argmax([history[-1] for history in restarts.log_likelihood_histories]))
    results = gated_em_batch(
        ctx.Z,
        ctx.y,
        design,
        np.stack([theta, restarts.thetas[best_restart]]),
        max_iter=_GATE_MAX_ITER,
        tol=_GATE_TOL,
        variance_floor=floor,
        deadline=ctx.deadline,
        sample_weight=ctx.sample_weight,
    )
    chosen = int(np.argmax([result.log_likelihood_history[-1] for result in results]))
    return GatedFit(
        em=results[chosen],
        scaling=scaling,
        design=design,
        start=("lines", "em restart")[chosen],
    )


def finish_gate(ctx: FitContext, gate: GatedFit) -> None:
    """Newton's method from gated EM's fit to the gated likelihood's maximum to working
    precision (gated EM stops at a change of 1e-8 per row; standard errors belong to the
    maximum): ``gate.em`` is updated in place, its last log-likelihood appended. Where Newton
    cannot finish (the information is not positive definite) gated EM's fit stays."""
    em_fit = gate.em
    start = GatedParameters(
        theta=em_fit.theta, variances=em_fit.variances, beta=em_fit.beta - em_fit.beta[0]
    )
    finished = gated_maximum_likelihood(ctx.Z, ctx.y, gate.design, start)
    if finished is None:
        return
    evaluated, params, _ = finished
    em_fit.theta, em_fit.variances, em_fit.beta = params.theta, params.variances, params.beta
    em_fit.log_likelihood_history = [
        *em_fit.log_likelihood_history,
        evaluated.log_likelihood / ctx.Z.shape[0],
    ]


def gate_parameter_count(n_components: int, n_params: int, n_concomitant: int) -> int:
    """Free parameters of a gated mixture: each line's coefficients (``n_params``, intercept
    included) and noise variance, and the gate's ``n_components - 1`` free rows."""
    return n_components * (n_params + 1) + (n_components - 1) * (n_concomitant + 1)


def gate_result(
    gate: GatedFit,
    order: NDArray[np.intp],
    ctx: FitContext,
    scaling: Scaling,
    *,
    on_features: bool,
) -> GateFit:
    """The gated fit's attributes, components in the estimator's order."""
    beta = gate.em.beta[order]
    # The softmax is unchanged by a common shift: the first component becomes the reference.
    beta -= beta[0]
    n_gate_params = gate.design.shape[1]
    n_observations = float(
        gate.design.shape[0] if ctx.sample_weight is None else ctx.sample_weight.sum()
    )
    k = beta.shape[0]
    gate_coef, gate_intercept = gate.scaling.to_caller(beta)
    # The density of y is that of the scaled target divided by the scale.
    history = np.asarray(gate.em.log_likelihood_history) - float(np.log(scaling.y_scale))
    log_likelihood = float(n_observations * history[-1])
    n_parameters = gate_parameter_count(k, ctx.Z.shape[1], n_gate_params - 1)
    return GateFit(
        gate_coef_=gate_coef,
        gate_intercept_=gate_intercept,
        weights_=weighted_mean(np.exp(log_gate(gate.design, beta)).T, ctx.sample_weight),
        noise_variance_=in_caller_units(gate.em.variances[order], ctx.loss_scale),
        log_likelihood_history_=history,
        log_likelihood_=log_likelihood,
        bic_=-2.0 * log_likelihood + n_parameters * float(np.log(n_observations)),
        gate_n_iter_=gate.em.n_iter,
        gate_converged_=gate.em.converged,
        gate_start_=gate.start,
        gate_on_features_=on_features,
        n_concomitant_in_=n_gate_params - 1,
    )
