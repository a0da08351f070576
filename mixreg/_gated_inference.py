"""Standard errors of a gated mixture of regressions (flexmix's concomitant model).

The gated mixture's log-likelihood, its score and observed information (Louis's identity, as
:func:`mixreg._inference.likelihood_pass`, with the gate's free rows in place of the mixing
logits), Newton's finish of gated EM, and the Jacobian that maps the covariance to the
caller's units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._gate import GateScaling
from ._inference import (
    BLOCK_ELEMENTS,
    LikelihoodPass,
    fill_lines_jacobian,
    line_scores,
    newton_maximize,
)

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class GatedParameters:
    """Lines, noise variances and gate of a gated mixture of regressions (flexmix's
    concomitant model), in the scaled units of the lines and the gate's design.

    The packed vector is, per line, ``theta_j`` then ``eta_j = log s_j^2``, then the gate's
    free rows ``beta_1, ..., beta_{k-1}`` (row 0 is the reference, fixed at zero), each over
    the gate's design columns (standardized concomitant columns, then the constant).

    Attributes
    ----------
    theta : ndarray of shape (n_components, n_params)
    variances : ndarray of shape (n_components,)
    beta : ndarray of shape (n_components, n_gate_params)
        With ``beta[0] == 0``.
    """

    theta: FloatArray
    variances: FloatArray
    beta: FloatArray

    @property
    def n_components(self) -> int:
        return int(self.theta.shape[0])

    def to_vector(self) -> FloatArray:
        """The packed vector ``(theta_0, eta_0, ..., theta_{k-1}, eta_{k-1}, beta_1, ..)``."""
        per_line = np.column_stack([self.theta, np.log(self.variances)])
        return np.concatenate([per_line.ravel(), self.beta[1:].ravel()])

    @classmethod
    def from_vector(
        cls, vector: FloatArray, n_components: int, n_gate_params: int
    ) -> GatedParameters:
        """Unpack :meth:`to_vector`'s layout."""
        n_gate = (n_components - 1) * n_gate_params
        n_line = (vector.size - n_gate) // n_components
        per_line = vector[: n_components * n_line].reshape(n_components, n_line)
        beta = np.zeros((n_components, n_gate_params))
        beta[1:] = vector[n_components * n_line :].reshape(n_components - 1, n_gate_params)
        return cls(theta=per_line[:, :-1].copy(), variances=np.exp(per_line[:, -1]), beta=beta)


def _gated_posteriors(
    Z: FloatArray, y: FloatArray, W: FloatArray, params: GatedParameters
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Residuals, posteriors and gate probabilities of each line, each row's log-likelihood.

    Returns
    -------
    residuals, posteriors, gate : ndarray of shape (n_rows, n_components)
    row_log_likelihood : ndarray of shape (n_rows,)
    """
    residuals = y[:, None] - Z @ params.theta.T
    log_gate = W @ params.beta.T
    log_gate -= log_gate.max(axis=1, keepdims=True)
    log_gate -= np.log(np.exp(log_gate).sum(axis=1, keepdims=True))
    log_joint = (
        log_gate
        - 0.5 * np.log(2.0 * np.pi * params.variances)
        - residuals * residuals / (2.0 * params.variances)
    )
    top = log_joint.max(axis=1, keepdims=True)
    joint = np.exp(log_joint - top)
    total = joint.sum(axis=1, keepdims=True)
    return residuals, joint / total, np.exp(log_gate), (top + np.log(total))[:, 0]


def gated_log_likelihood(
    Z: FloatArray, y: FloatArray, W: FloatArray, params: GatedParameters
) -> float:
    """The log-likelihood of the gated mixture, summed over rows."""
    return float(_gated_posteriors(Z, y, W, params)[3].sum())


def gated_row_scores(
    Z: FloatArray, y: FloatArray, W: FloatArray, params: GatedParameters
) -> FloatArray:
    """Each row's gradient of its log-likelihood in :class:`GatedParameters`' packed layout.

    Returns
    -------
    scores : ndarray of shape (n_rows, n_packed)
    """
    residuals, posteriors, gate, _ = _gated_posteriors(Z, y, W, params)
    per_line = posteriors[:, :, None] * line_scores(Z, residuals, params.variances)
    # d log pi_j / d beta_m = (delta_jm - pi_m) w, so the row's gate score is (tau_m - pi_m) w.
    gate_scores = (posteriors - gate)[:, 1:, None] * W[:, None, :]
    return np.column_stack([per_line.reshape(y.size, -1), gate_scores.reshape(y.size, -1)])


def gated_likelihood_pass(
    Z: FloatArray, y: FloatArray, W: FloatArray, params: GatedParameters
) -> LikelihoodPass:
    """The log-likelihood of the gated mixture, its gradient and minus its Hessian in
    :class:`GatedParameters`' packed layout, in one pass over blocks of rows.

    Louis's identity as :func:`likelihood_pass`, with the gate in place of the mixing logits:
    ``log pi_j(w)`` has gradient ``(e_j - pi)`` times ``w`` in the free rows, and Hessian
    ``-(diag(pi) - pi pi^T)`` times ``w w^T`` whatever the line, so its terms are, per row,
    weighted Gram matrices of the gate's design (and, with the lines' scores, of both designs).
    """
    n_samples, n_params = Z.shape
    k, n_gate_params = params.beta.shape
    n_line = n_params + 1
    n_free = k - 1
    n_lines_packed = k * n_line
    n_packed = n_lines_packed + n_free * n_gate_params
    information = np.zeros((n_packed, n_packed))
    score = np.zeros(n_packed)
    total_log_likelihood = 0.0
    variances = params.variances
    block = max(1, BLOCK_ELEMENTS // max(1, n_packed))
    for start in range(0, n_samples, block):
        Z_block, W_block = Z[start : start + block], W[start : start + block]
        residuals, posteriors, gate, row_log_likelihood = _gated_posteriors(
            Z_block, y[start : start + block], W_block, params
        )
        n_rows = Z_block.shape[0]
        total_log_likelihood += float(row_log_likelihood.sum())
        scaled = residuals / variances
        standardized = residuals * scaled
        # Each line's score s_ij (theta then eta) and the row's score g_i.
        line_scores = np.empty((n_rows, k, n_line))
        np.multiply(scaled[:, :, None], Z_block[:, None, :], out=line_scores[:, :, :-1])
        line_scores[:, :, -1] = 0.5 * (standardized - 1.0)
        row_score = np.empty((n_rows, n_packed))
        row_score[:, :n_lines_packed] = (posteriors[:, :, None] * line_scores).reshape(n_rows, -1)
        row_score[:, n_lines_packed:] = (
            (posteriors - gate)[:, 1:, None] * W_block[:, None, :]
        ).reshape(n_rows, -1)
        score += row_score.sum(axis=0)
        information += row_score.T @ row_score
        # Minus sum_j tau_ij (s_ij s_ij^T + H_ij), block by block.
        for line in range(k):
            own = slice(line * n_line, (line + 1) * n_line)
            tau = posteriors[:, line]
            # Lines: (s^2 - r^2) / s^4 z z^T, r / s^2 (3 - r^2 / s^2) / 2 z and
            # r^2 / (2 s^2) - (r^2 / s^2 - 1)^2 / 4, as in likelihood_pass.
            curvature = tau * (1.0 - standardized[:, line]) / variances[line]
            cross = tau * scaled[:, line] * (1.5 - 0.5 * standardized[:, line])
            information[own.start : own.stop - 1, own.start : own.stop - 1] += (
                Z_block * curvature[:, None]
            ).T @ Z_block
            cross_theta = cross @ Z_block
            information[own.start : own.stop - 1, own.stop - 1] += cross_theta
            information[own.stop - 1, own.start : own.stop - 1] += cross_theta
            information[own.stop - 1, own.stop - 1] += float(
                tau @ (0.5 * standardized[:, line] - 0.25 * (standardized[:, line] - 1.0) ** 2)
            )
            # Line and gate: -sum_i tau_ij s_ij (delta_jm - pi_im) w_i^T for every free m.
            offsets = (np.arange(1, k) == line)[None, :] - gate[:, 1:]  # (rows, k - 1)
            weighted = (tau[:, None, None] * line_scores[:, line, :, None]) * offsets[:, None, :]
            cross_gate = np.einsum("iam,ib->amb", weighted, W_block, optimize=True).reshape(
                n_line, -1
            )
            information[own, n_lines_packed:] -= cross_gate
            information[n_lines_packed:, own] -= cross_gate.T
        # Gate and gate, block (m, l): -sum_i c_iml w_i w_i^T with
        # c_iml = sum_j tau_ij (e_j - pi_i)_m (e_j - pi_i)_l - (diag(pi_i) - pi_i pi_i^T)_ml
        #       = delta_ml (tau_im - pi_im) - tau_im pi_il - pi_im tau_il + 2 pi_im pi_il.
        tau_free, pi_free = posteriors[:, 1:], gate[:, 1:]
        coupling = (
            -tau_free[:, :, None] * pi_free[:, None, :]
            - pi_free[:, :, None] * tau_free[:, None, :]
            + 2.0 * pi_free[:, :, None] * pi_free[:, None, :]
        )
        coupling[:, np.arange(n_free), np.arange(n_free)] += tau_free - pi_free
        gate_block = np.einsum("iml,ia,ib->malb", coupling, W_block, W_block, optimize=True)
        information[n_lines_packed:, n_lines_packed:] -= gate_block.reshape(
            n_free * n_gate_params, n_free * n_gate_params
        )
    return LikelihoodPass(log_likelihood=total_log_likelihood, score=score, information=information)


def gated_maximum_likelihood(
    Z: FloatArray, y: FloatArray, W: FloatArray, start: GatedParameters
) -> tuple[LikelihoodPass, GatedParameters, int] | None:
    """Newton's method (:func:`newton_maximize`) on the gated mixture's log-likelihood from a
    fit gated EM brought near a maximum: the maximum to working precision, with the pass (the
    log-likelihood, score and information) there and the number of steps; None where the
    information is not positive definite or no step helps."""
    k, n_gate_params = start.beta.shape

    def unpack(vector: FloatArray) -> GatedParameters:
        return GatedParameters.from_vector(vector, k, n_gate_params)

    finished = newton_maximize(
        lambda vector: gated_likelihood_pass(Z, y, W, unpack(vector)),
        lambda vector: gated_log_likelihood(Z, y, W, unpack(vector)),
        start.to_vector(),
        float(y.size),
    )
    if finished is None:
        return None
    evaluated, vector, steps = finished
    return evaluated, unpack(vector), steps


def gated_caller_jacobian(
    params: GatedParameters,
    line_jacobian: FloatArray,
    variance_scale: float,
    gate_scaling: GateScaling,
) -> FloatArray:
    """Jacobian of the caller's parameters of a gated mixture in the packed ones.

    The caller's vector is, per line, as :func:`caller_jacobian`'s, then every free row of the
    gate: its slopes on the raw concomitant columns (``beta / scale``) and its intercept
    (``beta_0 - sum(beta * mean / scale)``), both linear in the standardized row.

    Returns
    -------
    jacobian : ndarray of shape (n_packed, n_packed)
    """
    k, n_params = params.theta.shape
    n_gate_params = params.beta.shape[1]
    n_lines = k * (n_params + 1)
    n_packed = n_lines + (k - 1) * n_gate_params
    jacobian = np.zeros((n_packed, n_packed))
    fill_lines_jacobian(jacobian, params.variances, line_jacobian, variance_scale)
    row = np.zeros((n_gate_params, n_gate_params))
    row[:-1, :-1] = np.diag(1.0 / gate_scaling.scale)
    row[-1, :-1] = -gate_scaling.mean / gate_scaling.scale
    row[-1, -1] = 1.0
    jacobian[n_lines:, n_lines:] = np.kron(np.eye(k - 1), row)
    return jacobian
