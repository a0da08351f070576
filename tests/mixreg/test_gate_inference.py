"""Standard errors of a gated mixture: its score, observed information and the estimator's."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg._gated_inference import (
    GatedParameters,
    gated_likelihood_pass,
    gated_log_likelihood,
    gated_maximum_likelihood,
    gated_row_scores,
)

GATE_TRUTH = np.array([[0.0, 0.0], [1.5, 0.3]])  # per component: slope on w, intercept
LINES_TRUTH = (np.array([[2.0, -1.0], [-2.0, 1.0]]), np.array([0.0, 4.0]))


def _gated_rows(rng, n, noise=0.5):
    """Rows of two lines whose probabilities follow a logit of a column w."""
    coef, intercept = LINES_TRUTH
    X = rng.standard_normal((n, 2))
    w = rng.standard_normal((n, 1))
    logits = w * GATE_TRUTH[:, 0] + GATE_TRUTH[:, 1]
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    lines = (rng.random(n) < probabilities[:, 1]).astype(int)
    y = np.einsum("ij,ij->i", X, coef[lines]) + intercept[lines] + noise * rng.standard_normal(n)
    return X, y, w


@pytest.fixture
def gated_design():
    rng = np.random.default_rng(5)
    n, d, k, q = 300, 2, 3, 2
    Z = np.column_stack([rng.standard_normal((n, d)), np.ones(n)])
    W = np.column_stack([rng.standard_normal((n, q)), np.ones(n)])
    theta = rng.standard_normal((k, d + 1))
    y = (Z @ theta.T)[np.arange(n), rng.integers(0, k, n)] + 0.3 * rng.standard_normal(n)
    beta = np.vstack([np.zeros(q + 1), rng.standard_normal((k - 1, q + 1))])
    # Away from the maximum, so that every term of Louis's identity counts.
    params = GatedParameters(theta + 0.1, np.array([0.1, 0.2, 0.3]), beta)
    return Z, y, W, params


def _central_differences(function, vector, step=1e-5):
    return np.array(
        [
            (function(vector + step * unit) - function(vector - step * unit)) / (2 * step)
            for unit in np.eye(vector.size)
        ]
    )


def test_gated_score_is_the_gradient_of_the_log_likelihood(gated_design):
    Z, y, W, params = gated_design
    k, p = params.beta.shape

    def log_likelihood(vector):
        return gated_log_likelihood(Z, y, W, GatedParameters.from_vector(vector, k, p))

    numeric = _central_differences(log_likelihood, params.to_vector())
    evaluated = gated_likelihood_pass(Z, y, W, params)
    assert np.abs(evaluated.score).max() > 1.0
    np.testing.assert_allclose(evaluated.score, numeric, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(
        evaluated.score, gated_row_scores(Z, y, W, params).sum(axis=0), atol=1e-9
    )
    assert evaluated.log_likelihood == pytest.approx(gated_log_likelihood(Z, y, W, params))


def test_gated_information_is_minus_the_hessian_of_the_log_likelihood(gated_design):
    Z, y, W, params = gated_design
    k, p = params.beta.shape

    def score(vector):
        return gated_row_scores(Z, y, W, GatedParameters.from_vector(vector, k, p)).sum(axis=0)

    numeric = -_central_differences(score, params.to_vector())
    information = gated_likelihood_pass(Z, y, W, params).information
    np.testing.assert_allclose(information, information.T, atol=1e-9)
    np.testing.assert_allclose(information, numeric, rtol=1e-5, atol=1e-4)


def test_gated_newton_reaches_a_zero_score():
    rng = np.random.default_rng(1)
    X, y, w = _gated_rows(rng, 1500)
    model = MixtureOfLinearRegressions(2, gating=True, random_state=0).fit(X, y, concomitant=w)
    Z = np.column_stack([X, np.ones(len(y))])
    W = np.column_stack([w, np.ones(len(y))])
    beta = np.column_stack([model.gate_coef_, model.gate_intercept_])
    start = GatedParameters(
        np.column_stack([model.coef_, model.intercept_]), model.noise_variance_, beta
    )
    before = gated_likelihood_pass(Z, y, W, start)
    finished = gated_maximum_likelihood(Z, y, W, start)
    assert finished is not None
    evaluated, params, _ = finished
    assert evaluated.log_likelihood >= before.log_likelihood
    assert np.abs(evaluated.score).max() < 1e-6 * max(1.0, np.abs(before.score).max())
    assert evaluated.log_likelihood == pytest.approx(gated_log_likelihood(Z, y, W, params))


def test_gated_fit_reports_the_gate_standard_errors():
    rng = np.random.default_rng(2)
    X, y, w = _gated_rows(rng, 1200)
    model = MixtureOfLinearRegressions(2, gating=True, standard_errors=True, random_state=0).fit(
        X, y, concomitant=w
    )
    assert model.gate_coef_se_.shape == (2, 1)
    assert model.gate_intercept_se_.shape == (2,)
    # The reference component's row is fixed at zero; the other's has a positive error.
    assert model.gate_coef_se_[0, 0] == 0.0 and model.gate_intercept_se_[0] == 0.0
    assert model.gate_coef_se_[1, 0] > 0.0 and model.gate_intercept_se_[1] > 0.0
    assert np.all(model.coef_se_ > 0) and np.all(model.noise_variance_se_ > 0)
    assert np.all(np.isnan(model.weights_se_))
    np.testing.assert_array_equal(model.ml_coef_, model.coef_)
    # The errors are the square roots of the covariance's diagonal, gate last.
    np.testing.assert_allclose(
        np.sqrt(np.diag(model.covariance_))[-2:],
        [model.gate_coef_se_[1, 0], model.gate_intercept_se_[1]],
        rtol=1e-12,
    )
    intervals = model.confidence_intervals(0.9)
    assert intervals["gate_coef"].shape == (2, 1, 2)
    np.testing.assert_allclose(
        intervals["gate_intercept"][1],
        model.gate_intercept_[1]
        + np.array([-1, 1]) * 1.6448536269514722 * model.gate_intercept_se_[1],
    )
    table = model.summary(feature_names=["a", "b"], concomitant_names=["w"])
    assert [(row.component, row.parameter) for row in table.gate_rows] == [
        (1, "(Intercept)"),
        (1, "w"),
    ]
    assert table.gate_rows[1].std_error == pytest.approx(model.gate_coef_se_[1, 0])
    assert "Concomitant model (gate)" in str(table)
    with pytest.raises(ValueError, match="concomitant_names has 2 names"):
        model.summary(concomitant_names=["w", "v"])
    # The gate's log-likelihood is the maximum the errors belong to: no lower than gated EM's.
    plain = MixtureOfLinearRegressions(2, gating=True, random_state=0).fit(X, y, concomitant=w)
    assert model.log_likelihood_ >= plain.log_likelihood_ - 1e-9
    assert not hasattr(plain, "gate_coef_se_")


def test_gated_intervals_cover_the_true_gate_and_lines():
    rng = np.random.default_rng(11)
    coef, intercept = LINES_TRUTH
    truth = np.column_stack([coef, intercept])
    covered = []
    for _ in range(20):
        X, y, w = _gated_rows(rng, 600)
        model = MixtureOfLinearRegressions(
            2, gating=True, standard_errors=True, random_state=0
        ).fit(X, y, concomitant=w)
        # Line 1 of the truth has the larger intercept; the gate is relative to component 0.
        order = np.argsort(model.intercept_)
        intervals = model.confidence_intervals(0.95)
        lines = np.concatenate(
            [intervals["coef"][order], intervals["intercept"][order][:, None, :]], axis=1
        )
        covered += list(((lines[..., 0] <= truth) & (truth <= lines[..., 1])).ravel())
        sign = 1.0 if order[0] == 0 else -1.0  # the reference is the truth's line 0 or 1
        gate_truth = sign * GATE_TRUTH[1]
        other = 1
        low = [intervals["gate_coef"][other, 0, 0], intervals["gate_intercept"][other, 0]]
        high = [intervals["gate_coef"][other, 0, 1], intervals["gate_intercept"][other, 1]]
        covered += [lo <= t <= hi for lo, t, hi in zip(low, gate_truth, high, strict=True)]
    rate = float(np.mean(covered))
    # 160 intervals: far outside [0.89, 0.99] only if the errors are too small or too large.
    assert 0.89 <= rate <= 0.99, rate


@pytest.mark.parametrize(
    ("n_components", "fit_intercept", "on_features"),
    [(1, True, False), (2, True, True), (2, False, False)],
)
def test_gated_errors_at_the_edges(n_components, fit_intercept, on_features):
    rng = np.random.default_rng(6)
    X, y, w = _gated_rows(rng, 400)
    model = MixtureOfLinearRegressions(
        n_components,
        gating=True,
        standard_errors=True,
        fit_intercept=fit_intercept,
        random_state=0,
    ).fit(X, y, **({} if on_features else {"concomitant": w}))
    n_gate_columns = 2 if on_features else 1
    assert model.gate_coef_se_.shape == (n_components, n_gate_columns)
    assert np.all(model.coef_se_ > 0)
    n_line = 2 + fit_intercept + 1
    n_gate = (n_components - 1) * (n_gate_columns + 1)
    assert model.covariance_.shape == (n_components * n_line + n_gate,) * 2
    # A single line's gate has no free row: no gate rows, and the line's own errors.
    assert len(model.summary().gate_rows) == (n_components - 1) * (n_gate_columns + 1)
