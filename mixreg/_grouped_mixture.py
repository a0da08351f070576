"""The maximum-likelihood mixture reported beside the lines of a grouped ``auto`` fit.

Grouped EM from the fitted min-loss lines, or the best grouped EM start of the search when
it ends higher (its lines matched to the min-loss lines); the estimator reports it as
``ml_coef_``, ``weights_``, ``noise_variance_`` and ``log_likelihood_``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from ._auto import EM_MAX_ITER, EM_TOL
from ._em import EMResult, em
from ._solvers import FitContext

FloatArray = NDArray[np.float64]


def grouped_mixture(ctx: FitContext, theta: FloatArray, em_restart: EMResult | None) -> EMResult:
    """The maximum-likelihood mixture reported beside grouped min-loss lines.

    Grouped EM from the lines ``theta`` (weights and variances from the partition of the
    groups they induce), to EM's own tolerance; when the best EM start of the search
    (``em_restart``) ends higher, that one, its lines matched to ``theta``'s by the
    assignment of least total squared distance, so that each keeps its min-loss line's index.

    Parameters
    ----------
    ctx : FitContext
        The fit's (scaled) rows, weights and groups.
    theta : ndarray of shape (n_components, n_params)
    em_restart : EMResult, optional

    Returns
    -------
    EMResult
        Its ``log_likelihood_history`` ends with the mean log-likelihood per unit of weight.
    """
    finish = em(
        ctx.Z,
        ctx.y,
        theta,
        max_iter=EM_MAX_ITER,
        tol=EM_TOL,
        deadline=ctx.deadline,
        sample_weight=ctx.sample_weight,
        grouping=ctx.grouping,
        solver=ctx.least_squares,
    )
    if em_restart is None or not _higher(em_restart, finish):
        return finish
    assert em_restart.weights is not None and em_restart.variances is not None
    distances = ((theta[:, None, :] - em_restart.theta[None, :, :]) ** 2).sum(axis=2)
    _, matched = linear_sum_assignment(distances)
    return replace(
        em_restart,
        theta=em_restart.theta[matched],
        weights=em_restart.weights[matched],
        variances=em_restart.variances[matched],
    )


def _higher(first: EMResult, second: EMResult) -> bool:
    """Whether ``first`` ends at a higher likelihood than ``second``."""
    assert first.log_likelihood_history and second.log_likelihood_history
    return first.log_likelihood_history[-1] > second.log_likelihood_history[-1]
