"""Standard errors of a mixture of regressions: the observed information and the polish.

The model is the Gaussian mixture of regressions ``y | z ~ sum_j pi_j N(<z, theta_j>, s_j^2)``.
Its parameters are packed into one vector, per line ``theta_j`` then ``eta_j = log s_j^2``,
then the logits ``alpha_j = log(pi_j / pi_0)`` of lines 1..k-1 (line 0 is the reference):
an unconstrained parametrization in which the log-likelihood is smooth, so its Hessian is the
observed information. Every function works on the estimator's scaled design ``Z`` (centred,
scaled features and a last column of ones when there is an intercept); the estimator maps the
covariance to the caller's units with the (linear) Jacobian of its scaling.

The observed information is Louis's identity row by row: with ``tau_ij`` the posterior of line
j for row i, ``s_ij`` the gradient and ``H_ij`` the Hessian of ``log(pi_j f_j(y_i | z_i))``,
and ``g_i = sum_j tau_ij s_ij`` the row's score,

    -d^2 l / d psi^2 = sum_i [ g_i g_i^T - sum_j tau_ij (s_ij s_ij^T + H_ij) ],

accumulated over row blocks with matrix products (no loop over rows), each row weighted by
an optional frequency weight. The maximum-likelihood polish (EM, then Newton's method with
this information) reaches the fit the errors belong to. The gated mixture's information is in
:mod:`mixreg._gated_inference`, the bootstrap in :mod:`mixreg._bootstrap`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from scipy.linalg.blas import dsyrk
from scipy.optimize import linear_sum_assignment
from scipy.special import ndtr, ndtri

from ._em import EMResult, em

FloatArray = NDArray[np.float64]

# Elements of a row block's per-line score array (rows x lines x parameters): 1 MiB, so that
# a block's arrays stay in cache between the elementwise steps and the products that read them.
BLOCK_ELEMENTS = 1 << 17
# The EM polish that reaches the maximum-likelihood fit: change of the mean log-likelihood
# per row (scaled units) at which it stops, and its cap on iterations.
POLISH_TOL = 1e-10
POLISH_MAX_ITER = 5000
# The Newton finish of the polish: it takes over from EM that has not converged after
# NEWTON_AFTER iterations (one pass of the information costs about two EM iterations, and
# Newton needs two or three); it stops when the decrement g^T I^{-1} g per unit of weight is
# below NEWTON_TOL (the parameters are then within about its square root of the maximum, in
# units of one row's information).
NEWTON_AFTER = 20
NEWTON_TOL = 1e-15
NEWTON_MAX_STEPS = 10
NEWTON_MAX_HALVINGS = 20
_ROUNDING_SLACK = 1e-14
# Eigenvalues of the information below this fraction of the largest make it singular.
_SINGULAR_RCOND = 1e-12


@dataclass(frozen=True)
class MixtureParameters:
    """Lines, mixing weights and noise variances of a Gaussian mixture of regressions.

    Attributes
    ----------
    theta : ndarray of shape (n_components, n_params)
    weights : ndarray of shape (n_components,)
    variances : ndarray of shape (n_components,)
    """

    theta: FloatArray
    weights: FloatArray
    variances: FloatArray

    @property
    def n_components(self) -> int:
        return int(self.theta.shape[0])

    def to_vector(self) -> FloatArray:
        """The packed vector ``(theta_0, eta_0, ..., theta_{k-1}, eta_{k-1}, alpha_1.. )``."""
        per_line = np.column_stack([self.theta, np.log(self.variances)])
        logits = np.log(self.weights[1:]) - np.log(self.weights[0])
        return np.concatenate([per_line.ravel(), logits])

    @classmethod
    def from_vector(cls, vector: FloatArray, n_components: int) -> MixtureParameters:
        """Unpack :meth:`to_vector`'s layout."""
        n_line = (vector.size - (n_components - 1)) // n_components
        per_line = vector[: n_components * n_line].reshape(n_components, n_line)
        logits = np.concatenate([[0.0], vector[n_components * n_line :]])
        weights = np.exp(logits - logits.max())
        return cls(
            theta=per_line[:, :-1].copy(),
            weights=weights / weights.sum(),
            variances=np.exp(per_line[:, -1]),
        )


def _block_rows(n_components: int, n_params: int) -> int:
    return max(1, BLOCK_ELEMENTS // (n_components * (n_params + 1)))


def _row_weights(sample_weight: FloatArray | None, n_samples: int) -> FloatArray:
    if sample_weight is None:
        return np.ones(n_samples)
    return np.asarray(sample_weight, dtype=np.float64)


def _posteriors(
    Z: FloatArray, y: FloatArray, params: MixtureParameters
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Residuals, posteriors of each line and log-likelihood of each row.

    Returns
    -------
    residuals, posteriors : ndarray of shape (n_rows, n_components)
    row_log_likelihood : ndarray of shape (n_rows,)
    """
    residuals = y[:, None] - Z @ params.theta.T
    log_joint = (
        np.log(params.weights)
        - 0.5 * np.log(2.0 * np.pi * params.variances)
        - residuals * residuals / (2.0 * params.variances)
    )
    top = log_joint.max(axis=1, keepdims=True)
    joint = np.exp(log_joint - top)
    total = joint.sum(axis=1, keepdims=True)
    return residuals, joint / total, (top + np.log(total))[:, 0]


def line_scores(Z: FloatArray, residuals: FloatArray, variances: FloatArray) -> FloatArray:
    """Gradient of ``log f_j(y_i | z_i)`` in ``(theta_j, eta_j)``: shape (rows, k, p + 1)."""
    n_rows, n_components = residuals.shape
    scaled = residuals / variances
    scores = np.empty((n_rows, n_components, Z.shape[1] + 1))
    np.multiply(scaled[:, :, None], Z[:, None, :], out=scores[:, :, :-1])
    scores[:, :, -1] = 0.5 * (residuals * scaled - 1.0)
    return scores


def log_likelihood(
    Z: FloatArray,
    y: FloatArray,
    params: MixtureParameters,
    sample_weight: FloatArray | None = None,
) -> float:
    """The (weighted) log-likelihood of the mixture, summed over rows."""
    _, _, row_log_likelihood = _posteriors(Z, y, params)
    return float(_row_weights(sample_weight, y.size) @ row_log_likelihood)


def row_scores(Z: FloatArray, y: FloatArray, params: MixtureParameters) -> FloatArray:
    """Each row's gradient of its log-likelihood in the packed parameters.

    Returns
    -------
    scores : ndarray of shape (n_rows, n_packed)
        Laid out as :meth:`MixtureParameters.to_vector`.
    """
    residuals, posteriors, _ = _posteriors(Z, y, params)
    per_line = posteriors[:, :, None] * line_scores(Z, residuals, params.variances)
    logits = posteriors[:, 1:] - params.weights[1:]
    return np.column_stack([per_line.reshape(y.size, -1), logits])


@dataclass(frozen=True)
class LikelihoodPass:
    """What one pass over the rows gives at a mixture: its (weighted) log-likelihood, score
    and observed information in the packed parameters.

    Attributes
    ----------
    log_likelihood : float
    score : ndarray of shape (n_packed,)
    information : ndarray of shape (n_packed, n_packed)
    """

    log_likelihood: float
    score: FloatArray
    information: FloatArray


def likelihood_pass(
    Z: FloatArray,
    y: FloatArray,
    params: MixtureParameters,
    sample_weight: FloatArray | None = None,
) -> LikelihoodPass:
    """The log-likelihood, its gradient and minus its Hessian in the packed parameters.

    One pass over blocks of rows: each block's posteriors serve the three at once. The
    information is Louis's identity (see the module's docstring); each row counts
    ``sample_weight[i]`` times.
    """
    n_samples, n_params = Z.shape
    k = params.n_components
    n_line = n_params + 1
    n_packed = k * n_line + k - 1
    weights = _row_weights(sample_weight, n_samples)
    upper = np.zeros((n_packed, n_packed), order="F")
    score = np.zeros(n_packed)
    total_log_likelihood = 0.0
    # Per line: sum_i w tau_ij (-H_ij - s_ij s_ij^T) on its (theta_j, eta_j) block, the sum of
    # w tau_ij s_ij (which meets the logits) and the line's mass sum_i w tau_ij.
    line_blocks = np.zeros((k, n_line, n_line))
    line_score_sums = np.zeros((k, n_line))
    masses = np.zeros(k)
    variances = params.variances[:, None]
    log_prior = (np.log(params.weights) - 0.5 * np.log(2.0 * np.pi * params.variances))[:, None]
    # Every array of a block is laid out transposed (parameters or lines along the first axis,
    # the block's rows along the second), so each elementwise step runs over long contiguous
    # rows, and the blocks are small enough for the products to find them in cache.
    block = _block_rows(k, n_params)
    row_score = np.empty((n_packed, block))
    weighted_design = np.empty((k, n_params, block))
    for start in range(0, n_samples, block):
        stop = min(start + block, n_samples)
        n_rows = stop - start
        design = np.ascontiguousarray(Z[start:stop].T)
        w_block = weights[start:stop]
        residuals = y[start:stop] - params.theta @ design
        scaled = residuals / variances  # r / s^2
        standardized = residuals * scaled  # r^2 / s^2
        log_joint = log_prior - 0.5 * standardized
        top = log_joint.max(axis=0)
        posteriors = np.exp(log_joint - top)
        total_joint = posteriors.sum(axis=0)
        posteriors /= total_joint
        total_log_likelihood += float(w_block @ (top + np.log(total_joint)))
        # The rows' scores g_i, written in place: tau_ij s_ij per line, then the logits'.
        scores = row_score[:, :n_rows]
        per_line = scores[: k * n_line].reshape(k, n_line, n_rows)
        np.multiply(design[None], (posteriors * scaled)[:, None, :], out=per_line[:, :-1])
        np.multiply(posteriors, 0.5 * (standardized - 1.0), out=per_line[:, -1])
        np.subtract(posteriors[1:], params.weights[1:, None], out=scores[k * n_line :])
        score += scores @ w_block
        if sample_weight is not None:
            # Weights are non-negative: the weighted product is a rank-k update of rows scaled
            # by their square roots.
            scores *= np.sqrt(w_block)
        # BLAS adds the block's products to the upper triangle in place (scores.T is
        # Fortran-ordered: it reads it without a copy); the lower is filled in at the end.
        upper = dsyrk(1.0, scores.T, beta=1.0, c=upper, trans=1, overwrite_c=True)
        mass = posteriors * w_block
        masses += mass.sum(axis=1)
        # -H_ij - s_ij s_ij^T in closed form (H of log f_j: -z z^T / s^2, -z r / s^2 and
        # -r^2 / (2 s^2) at eta), summed over rows with weight w tau_ij:
        #   theta theta: (s^2 - r^2) / s^4 z z^T,  theta eta: r / s^2 (3 - r^2 / s^2) / 2 z,
        #   eta eta: r^2 / (2 s^2) - (r^2 / s^2 - 1)^2 / 4.
        curvature = mass * (1.0 - standardized) / variances
        cross = mass * scaled * (1.5 - 0.5 * standardized)
        curved = weighted_design[:, :, :n_rows]
        np.multiply(design[None], curvature[:, None, :], out=curved)
        line_blocks[:, :-1, :-1] += np.matmul(curved, design.T)
        cross_theta = cross @ design.T
        line_blocks[:, :-1, -1] += cross_theta
        line_blocks[:, -1, :-1] += cross_theta
        line_blocks[:, -1, -1] += np.einsum(
            "ji,ji->j", mass, 0.5 * standardized - 0.25 * (standardized - 1.0) ** 2
        )
        line_score_sums[:, :-1] += (mass * scaled) @ design.T
        line_score_sums[:, -1] += np.einsum("ji,ji->j", mass, 0.5 * (standardized - 1.0))
    information = np.triu(upper) + np.triu(upper, 1).T
    total = weights.sum()
    offsets = np.eye(k)[:, 1:] - params.weights[1:]  # (e_j - pi) on the logits, per line j
    logit_block = slice(k * n_line, n_packed)
    for line in range(k):
        own = slice(line * n_line, (line + 1) * n_line)
        information[own, own] += line_blocks[line]
        cross = np.outer(line_score_sums[line], offsets[line])
        information[own, logit_block] -= cross
        information[logit_block, own] -= cross.T
    # The logits' -H is total * (diag(pi) - pi pi^T) whatever the line; minus sum_j tau s s^T.
    pi = params.weights[1:]
    information[logit_block, logit_block] += total * (np.diag(pi) - np.outer(pi, pi))
    information[logit_block, logit_block] -= (offsets.T * masses) @ offsets
    return LikelihoodPass(log_likelihood=total_log_likelihood, score=score, information=information)


def observed_information(
    Z: FloatArray,
    y: FloatArray,
    params: MixtureParameters,
    sample_weight: FloatArray | None = None,
) -> FloatArray:
    """Minus the Hessian of the (weighted) log-likelihood in the packed parameters.

    Accumulated over blocks of rows by Louis's identity (see the module's docstring); each row
    counts ``sample_weight[i]`` times.

    Returns
    -------
    information : ndarray of shape (n_packed, n_packed)
    """
    return likelihood_pass(Z, y, params, sample_weight).information


def covariance_from_information(information: FloatArray) -> FloatArray | None:
    """The inverse of the information, or None when it is singular or not positive definite
    (a line with no rows, lines that coincide): then no standard error exists."""
    scale = np.sqrt(np.abs(np.diag(information)))
    scale[scale == 0.0] = 1.0
    equilibrated = information / np.outer(scale, scale)
    eigenvalues, eigenvectors = np.linalg.eigh(equilibrated)
    if eigenvalues[0] <= _SINGULAR_RCOND * max(eigenvalues[-1], 0.0):
        return None
    inverse = (eigenvectors / eigenvalues) @ eigenvectors.T
    covariance: FloatArray = inverse / np.outer(scale, scale)
    return covariance


def caller_jacobian(
    params: MixtureParameters, line_jacobian: FloatArray, variance_scale: float
) -> FloatArray:
    """Jacobian of the caller's parameters in the packed ones.

    The caller's vector is, per line, its coefficients then intercept (``line_jacobian`` times
    ``theta_j``) then its noise variance (``variance_scale * exp(eta_j)``), then the k mixing
    weights (the softmax of the logits).

    Returns
    -------
    jacobian : ndarray of shape (k * (n_params + 1) + k, k * (n_params + 1) + k - 1)
    """
    k, n_params = params.theta.shape
    n_line = n_params + 1
    jacobian = np.zeros((k * n_line + k, k * n_line + k - 1))
    fill_lines_jacobian(jacobian, params.variances, line_jacobian, variance_scale)
    pi = params.weights
    softmax = np.diag(pi) - np.outer(pi, pi)  # d pi_j / d logit_m
    jacobian[k * n_line :, k * n_line :] = softmax[:, 1:]
    return jacobian


def fill_lines_jacobian(
    jacobian: FloatArray, variances: FloatArray, line_jacobian: FloatArray, variance_scale: float
) -> None:
    """Fill the lines' diagonal blocks of a caller Jacobian (see :func:`caller_jacobian`)."""
    n_params = line_jacobian.shape[1]
    n_line = n_params + 1
    for line in range(variances.size):
        rows = slice(line * n_line, line * n_line + n_params)
        jacobian[rows, rows] = line_jacobian
        jacobian[line * n_line + n_params, line * n_line + n_params] = (
            variance_scale * variances[line]
        )


@dataclass(frozen=True)
class Polish:
    """The maximum-likelihood fit the polish reached.

    Attributes
    ----------
    params : MixtureParameters
    n_iter : int
        EM iterations.
    n_newton : int
        Newton steps taken after EM (0 when EM went to the tight tolerance itself).
    converged : bool
    at_maximum : LikelihoodPass or None
        The log-likelihood, score and information at ``params`` when Newton's method finished
        the fit (so the standard errors need no further pass over the rows); None otherwise.
    """

    params: MixtureParameters
    n_iter: int
    n_newton: int
    converged: bool
    at_maximum: LikelihoodPass | None


def _newton_direction(evaluated: LikelihoodPass) -> FloatArray | None:
    """``I^{-1} g`` by a Cholesky factorization of the equilibrated information; None when the
    information is not positive definite (not at or near a maximum)."""
    scale = np.sqrt(np.abs(np.diag(evaluated.information)))
    if not np.all(np.isfinite(scale)) or np.any(scale == 0.0):
        return None
    try:
        factor = cho_factor(evaluated.information / np.outer(scale, scale))
    except LinAlgError:
        return None
    direction: FloatArray = cho_solve(factor, evaluated.score / scale) / scale
    return direction if np.all(np.isfinite(direction)) else None


def _newton_finish(
    Z: FloatArray,
    y: FloatArray,
    start: MixtureParameters,
    sample_weight: FloatArray | None,
) -> tuple[LikelihoodPass, MixtureParameters, int] | None:
    """Newton's method on the log-likelihood from a point EM brought near a maximum
    (:func:`newton_maximize` on the mixture's packed parameters)."""
    k = start.n_components
    total_weight = float(y.size if sample_weight is None else np.sum(sample_weight))
    finished = newton_maximize(
        lambda vector: likelihood_pass(
            Z, y, MixtureParameters.from_vector(vector, k), sample_weight
        ),
        lambda vector: log_likelihood(
            Z, y, MixtureParameters.from_vector(vector, k), sample_weight
        ),
        start.to_vector(),
        total_weight,
    )
    if finished is None:
        return None
    evaluated, vector, steps = finished
    return evaluated, MixtureParameters.from_vector(vector, k), steps


def newton_maximize(
    evaluate: Callable[[FloatArray], LikelihoodPass],
    value: Callable[[FloatArray], float],
    start: FloatArray,
    total_weight: float,
) -> tuple[LikelihoodPass, FloatArray, int] | None:
    """Newton's method on a log-likelihood from a point near a maximum.

    Each step is ``psi + t I^{-1} g`` with ``t`` halved until the log-likelihood (``value``)
    does not decrease; it stops when the Newton decrement ``g^T I^{-1} g`` per unit of weight
    is below :data:`NEWTON_TOL`. Returns the pass (``evaluate``: log-likelihood, score and
    information) at the maximum, its parameters and the number of steps, or None when the
    information is not positive definite, no halving helps or the steps run out.
    """
    vector = start
    evaluated = evaluate(vector)
    for step in range(NEWTON_MAX_STEPS + 1):
        direction = _newton_direction(evaluated)
        if direction is None:
            return None
        decrement = float(evaluated.score @ direction)
        if decrement < 0.0:
            return None
        if decrement <= NEWTON_TOL * total_weight:
            return evaluated, vector, step
        if step == NEWTON_MAX_STEPS:
            return None
        # Rounding of a sum of n terms: a change below it is no decrease.
        slack = _ROUNDING_SLACK * (abs(evaluated.log_likelihood) + total_weight)
        for halving in range(NEWTON_MAX_HALVINGS + 1):
            candidate = vector + 0.5**halving * direction
            if value(candidate) >= evaluated.log_likelihood - slack:
                break
        else:
            return None
        vector = candidate
        evaluated = evaluate(vector)
    return None


def maximum_likelihood_polish(
    Z: FloatArray,
    y: FloatArray,
    theta: FloatArray,
    *,
    max_iter: int = POLISH_MAX_ITER,
    tol: float = POLISH_TOL,
    sample_weight: FloatArray | None = None,
    newton_finish: bool = True,
    weights: FloatArray | None = None,
    variances: FloatArray | None = None,
    variance_floor: float | None = None,
) -> Polish:
    """EM from the given lines (weights and variances from the partition they induce, or
    ``weights`` and ``variances`` when given) to the maximum-likelihood fit it reaches; the
    lines keep their labels; rows count ``sample_weight`` times; noise variances are floored
    at ``variance_floor`` (EM's default when None).

    EM runs to ``tol``; where it has not reached it after :data:`NEWTON_AFTER` iterations (EM
    crawls where lines overlap), Newton's method with the observed information finishes from
    there (quadratic convergence, the log-likelihood never decreasing). Where Newton cannot
    (the information is not positive definite, a step does not help), and always with
    ``newton_finish=False``, EM runs from the lines to ``tol``.
    """

    def run_em(iterations: int) -> EMResult:
        return em(
            Z,
            y,
            theta,
            max_iter=iterations,
            tol=tol,
            sample_weight=sample_weight,
            variance_floor=variance_floor,
            start_weights=weights,
            start_variances=variances,
        )

    if not newton_finish:
        return _em_polish(run_em(max_iter), 0)
    warm = run_em(min(max_iter, NEWTON_AFTER))
    if warm.converged or warm.n_iter >= max_iter:
        return _em_polish(warm, 0)
    assert warm.weights is not None and warm.variances is not None
    warm_params = MixtureParameters(
        theta=warm.theta, weights=warm.weights, variances=warm.variances
    )
    finished = _newton_finish(Z, y, warm_params, sample_weight)
    if finished is not None:
        evaluated, params, n_newton = finished
        return Polish(params, warm.n_iter, n_newton, True, evaluated)
    return _em_polish(run_em(max_iter), warm.n_iter)


def _em_polish(result: EMResult, earlier_iterations: int) -> Polish:
    assert result.weights is not None and result.variances is not None
    params = MixtureParameters(
        theta=result.theta, weights=result.weights, variances=result.variances
    )
    return Polish(params, earlier_iterations + result.n_iter, 0, result.converged, None)


def match_lines(reference: FloatArray, lines: FloatArray) -> NDArray[np.intp]:
    """The permutation of ``lines`` closest to ``reference``: the assignment (Hungarian) that
    minimizes the summed squared distances of matched lines' parameters.

    Returns
    -------
    order : ndarray of shape (n_components,)
        ``lines[order]`` is line by line matched to ``reference``.
    """
    cost = ((reference[:, None, :] - lines[None, :, :]) ** 2).sum(axis=2)
    _, order = linear_sum_assignment(cost)
    matched: NDArray[np.intp] = order.astype(np.intp)
    return matched


def two_sided_p_value(z: FloatArray) -> FloatArray:
    """``Pr(|N(0, 1)| > |z|)``."""
    p: FloatArray = 2.0 * ndtr(-np.abs(z))
    return p


def normal_quantile(level: float) -> float:
    """The two-sided critical value of a ``level`` interval, ``Phi^{-1}((1 + level) / 2)``."""
    return float(ndtri(0.5 + level / 2.0))


def check_level(level: Any) -> float:
    """The confidence level as a float in (0, 1), or ValueError naming it."""
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0.0 < level < 1.0:
        raise ValueError(f"level must be a number strictly between 0 and 1; got {level!r}")
    return float(level)
