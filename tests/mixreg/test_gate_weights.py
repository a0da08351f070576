"""A gated fit with sample weights: a row of integer weight w is w copies of itself, in gated
EM, in the gate's Newton step and in the estimator's likelihood and BIC."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg._gate import GateScaling, _newton, gated_em, log_gate
from mixreg.datasets import make_gated


def _gated_rows(seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = make_gated(
        n_samples=n, n_features=2, n_components=3, n_concomitant=2, noise=0.3, random_state=seed
    )
    return data.X, data.y, data.concomitant


def _design(X: np.ndarray) -> np.ndarray:
    return np.column_stack([X, np.ones(len(X))])


def test_weighted_newton_step_equals_the_step_on_repeated_rows() -> None:
    rng = np.random.default_rng(0)
    W = np.column_stack([rng.standard_normal((50, 2)), np.ones(50)])
    responsibilities = rng.dirichlet(np.ones(3), size=50)
    counts = rng.integers(1, 4, size=50)
    beta = np.zeros((1, 3, 3))
    start = log_gate(W, beta)
    row_weight = counts * (len(counts) / counts.sum())
    weighted, weighted_log = _newton(W, responsibilities[None], beta, start, 1, row_weight)
    W_repeated = np.repeat(W, counts, axis=0)
    repeated, _ = _newton(
        W_repeated,
        np.repeat(responsibilities, counts, axis=0)[None],
        beta,
        log_gate(W_repeated, beta),
        1,
    )
    np.testing.assert_allclose(weighted, repeated, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weighted_log, log_gate(W, weighted), rtol=1e-12)
    unweighted, _ = _newton(W, responsibilities[None], beta, start, 1)
    assert not np.allclose(unweighted, weighted)  # the weights matter


@pytest.mark.parametrize("seed", [1, 2])
def test_gated_em_with_integer_weights_equals_gated_em_on_repeated_rows(seed: int) -> None:
    X, y, concomitant = _gated_rows(seed)
    counts = np.random.default_rng(seed).integers(1, 4, size=len(y))
    Z = _design((X - X.mean(axis=0)) / X.std(axis=0))
    _, W_weighted = GateScaling.of(concomitant, counts.astype(float))
    _, W_repeated = GateScaling.of(np.repeat(concomitant, counts, axis=0))
    theta = np.random.default_rng(seed + 10).standard_normal((3, 3))
    settings = {"max_iter": 200, "tol": 1e-10, "variance_floor": 1e-10}
    weighted = gated_em(Z, y, W_weighted, theta, sample_weight=counts.astype(float), **settings)
    repeated = gated_em(
        np.repeat(Z, counts, axis=0), np.repeat(y, counts), W_repeated, theta, **settings
    )
    # The weighted scaling is the repeated rows' scaling: the designs agree row for row.
    np.testing.assert_allclose(np.repeat(W_weighted, counts, axis=0), W_repeated, rtol=1e-12)
    assert weighted.n_iter == repeated.n_iter
    np.testing.assert_allclose(weighted.theta, repeated.theta, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(weighted.variances, repeated.variances, rtol=1e-7)
    np.testing.assert_allclose(weighted.beta, repeated.beta, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(
        weighted.log_likelihood_history, repeated.log_likelihood_history, rtol=1e-9
    )


def test_weighted_gated_fit_reports_the_repeated_rows_likelihood() -> None:
    X, y, concomitant = _gated_rows(3)
    counts = np.random.default_rng(3).integers(1, 4, size=len(y)).astype(float)
    model = MixtureOfLinearRegressions(
        n_components=3, algorithm="am-classic", n_init=4, gating=True, random_state=0
    ).fit(X, y, sample_weight=counts, concomitant=concomitant)
    rows = np.repeat(np.arange(len(y)), counts.astype(int))
    total = model.gated_log_likelihood(X[rows], y[rows], concomitant[rows])
    assert model.log_likelihood_ == pytest.approx(total, rel=1e-9)
    n_parameters = 3 * (3 + 1) + 2 * (2 + 1)
    assert model.bic_ == pytest.approx(-2 * total + n_parameters * np.log(counts.sum()), rel=1e-9)
    probabilities = model.predict_proba(X, concomitant)
    np.testing.assert_allclose(model.weights_, counts @ probabilities / counts.sum(), rtol=1e-9)


def test_zero_weights_drop_their_concomitant_rows_too() -> None:
    X, y, concomitant = _gated_rows(4)
    weights = np.ones(len(y))
    weights[::3] = 0.0
    settings = {"n_components": 3, "algorithm": "am-classic", "gating": True, "random_state": 0}
    weighted = MixtureOfLinearRegressions(**settings).fit(
        X, y, sample_weight=weights, concomitant=concomitant
    )
    kept = weights > 0
    dropped = MixtureOfLinearRegressions(**settings).fit(
        X[kept], y[kept], concomitant=concomitant[kept]
    )
    np.testing.assert_array_equal(weighted.coef_, dropped.coef_)
    np.testing.assert_array_equal(weighted.gate_coef_, dropped.gate_coef_)
    assert weighted.log_likelihood_ == dropped.log_likelihood_


def test_gated_fit_still_refuses_groups_naming_them() -> None:
    X, y, concomitant = _gated_rows(5, n=60)
    with pytest.raises(ValueError, match="groups: a gated fit takes no groups"):
        MixtureOfLinearRegressions(n_components=2, algorithm="am-classic", gating=True).fit(
            X, y, groups=np.arange(len(y)) % 7, concomitant=concomitant
        )


def test_gated_fit_with_weights_refuses_standard_errors_naming_them() -> None:
    X, y, concomitant = _gated_rows(5, n=60)
    weights = 1.0 + np.arange(len(y)) % 3
    gated = MixtureOfLinearRegressions(
        n_components=2, algorithm="am-classic", gating=True, standard_errors=True
    )
    with pytest.raises(ValueError, match="standard_errors: a gated fit with sample weights"):
        gated.fit(X, y, sample_weight=weights, concomitant=concomitant)
    # Equal weights are no weights: the standard errors are computed.
    gated.fit(X, y, sample_weight=np.full(len(y), 2.0), concomitant=concomitant)
    assert np.all(np.isfinite(gated.gate_coef_se_))
