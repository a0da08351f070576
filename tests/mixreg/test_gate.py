"""The gate: its objective's derivatives, gated EM's monotone likelihood, recovery of a known
gate, determinism, k = 1, concomitant columns and the model document."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mixreg import MixtureOfLinearRegressions
from mixreg import _gate as gate_module
from mixreg._gate import (
    GateScaling,
    gate_gradient,
    gate_hessian,
    gate_m_step,
    gate_objective,
    gated_em,
    gated_log_densities,
    log_gate,
)
from mixreg.datasets import make_gated


def _random_gate_problem(
    seed: int, n: int = 40, k: int = 3, q: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    W = np.column_stack([rng.standard_normal((n, q)), np.ones(n)])
    responsibilities = rng.dirichlet(np.ones(k), size=n)
    beta = rng.standard_normal((k, q + 1))
    beta[0] = 0.0
    return W, responsibilities, beta


def _free_objective(
    W: np.ndarray, responsibilities: np.ndarray, beta: np.ndarray, free: np.ndarray
) -> float:
    trial = beta.copy()
    trial[1:] = free.reshape(beta.shape[0] - 1, -1)
    return gate_objective(W, responsibilities, trial)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_matches_finite_differences(seed: int) -> None:
    W, responsibilities, beta = _random_gate_problem(seed)
    free = beta[1:].ravel()
    step = 1e-6
    numeric = np.array(
        [
            (
                _free_objective(W, responsibilities, beta, free + step * unit)
                - _free_objective(W, responsibilities, beta, free - step * unit)
            )
            / (2 * step)
            for unit in np.eye(free.size)
        ]
    )
    np.testing.assert_allclose(gate_gradient(W, responsibilities, beta).ravel(), numeric, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hessian_matches_finite_differences_of_the_gradient(seed: int) -> None:
    W, responsibilities, beta = _random_gate_problem(seed, k=4, q=3)
    free = beta[1:].ravel()
    step = 1e-6

    def gradient_at(values: np.ndarray) -> np.ndarray:
        trial = beta.copy()
        trial[1:] = values.reshape(beta.shape[0] - 1, -1)
        return gate_gradient(W, responsibilities, trial).ravel()

    numeric = np.column_stack(
        [
            (gradient_at(free + step * unit) - gradient_at(free - step * unit)) / (2 * step)
            for unit in np.eye(free.size)
        ]
    )
    hessian = gate_hessian(W, beta)
    np.testing.assert_allclose(hessian, numeric, atol=1e-7)
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-15)


def test_newton_m_step_reaches_the_hand_worked_optimum() -> None:
    # With only the constant column the gate is a set of weights: the optimum puts
    # log(mean r_j / mean r_0) in row j.
    responsibilities = np.array(
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.3, 0.2, 0.5]]
    )
    W = np.ones((4, 1))
    beta = gate_m_step(W, responsibilities, np.zeros((3, 1)), max_steps=50)
    mean = responsibilities.mean(axis=0)
    np.testing.assert_allclose(beta[:, 0], np.log(mean / mean[0]), atol=1e-10)
    np.testing.assert_allclose(np.exp(log_gate(W, beta))[0], mean, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 3])
def test_newton_m_step_never_raises_the_objective_and_zeroes_the_gradient(seed: int) -> None:
    W, responsibilities, beta = _random_gate_problem(seed, n=200)
    before = gate_objective(W, responsibilities, beta)
    one_step = gate_m_step(W, responsibilities, beta, max_steps=1)
    assert gate_objective(W, responsibilities, one_step) <= before
    optimum = gate_m_step(W, responsibilities, beta, max_steps=50)
    assert np.max(np.abs(gate_gradient(W, responsibilities, optimum))) < 1e-9
    assert (optimum[0] == 0.0).all()


def test_one_component_gate_is_left_as_is() -> None:
    W, responsibilities, _ = _random_gate_problem(0, k=1)
    beta = np.zeros((1, W.shape[1]))
    assert (gate_m_step(W, responsibilities, beta) == 0.0).all()
    assert gate_hessian(W, beta).shape == (0, 0)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_samples=st.integers(12, 80),
    n_components=st.integers(1, 4),
    n_concomitant=st.integers(1, 3),
)
def test_gated_em_log_likelihood_never_decreases(
    seed: int, n_samples: int, n_components: int, n_concomitant: int
) -> None:
    rng = np.random.default_rng(seed)
    Z = np.column_stack([rng.standard_normal((n_samples, 2)), np.ones(n_samples)])
    y = rng.standard_normal(n_samples) + 3.0 * (rng.random(n_samples) < 0.5)
    _, W = GateScaling.of(rng.standard_normal((n_samples, n_concomitant)))
    theta = rng.standard_normal((n_components, 3))
    result = gated_em(Z, y, W, theta, max_iter=60, tol=0.0, variance_floor=1e-6 * float(np.var(y)))
    history = np.asarray(result.log_likelihood_history)
    assert np.isfinite(history).all()
    assert (np.diff(history) >= -1e-10 * np.maximum(1.0, np.abs(history[1:]))).all()


def _matching(fitted_coef: np.ndarray, true_coef: np.ndarray) -> np.ndarray:
    """perm[j] = the fitted component that plays true component j (closest lines)."""
    k = true_coef.shape[0]
    best = min(
        itertools.permutations(range(k)),
        key=lambda perm: float(np.sum((fitted_coef[list(perm)] - true_coef) ** 2)),
    )
    return np.array(best)


def test_gate_recovers_a_known_gate_within_its_standard_errors() -> None:
    data = make_gated(n_samples=10_000, n_features=2, n_components=3, noise=0.3, random_state=7)
    # Classical AM's lines start gated EM (the default search would only add seconds here).
    model = MixtureOfLinearRegressions(
        n_components=3, algorithm="am-classic", gating=True, random_state=0
    )
    model.fit(data.X, data.y)
    fitted_lines = np.column_stack([model.coef_, model.intercept_])
    perm = _matching(fitted_lines, np.column_stack([data.coef, data.intercept]))
    np.testing.assert_allclose(
        fitted_lines[perm], np.column_stack([data.coef, data.intercept]), atol=0.05
    )

    # Standardized units, the true first component as reference.
    scaling, W = GateScaling.of(data.concomitant)

    def standardized(coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
        beta = np.column_stack([coef * scaling.scale, intercept + coef @ scaling.mean])
        return beta - beta[0]

    fitted = standardized(model.gate_coef_[perm], model.gate_intercept_[perm])
    true = standardized(data.gate_coef, data.gate_intercept)
    information = data.X.shape[0] * gate_hessian(W, fitted)
    covariance = np.linalg.inv(information)
    difference = (fitted - true)[1:].ravel()
    z_scores = difference / np.sqrt(np.diag(covariance))
    assert np.max(np.abs(z_scores)) < 3.0, z_scores
    mahalanobis = float(difference @ information @ difference)
    assert mahalanobis < stats.chi2.ppf(0.99, difference.size), mahalanobis

    true_accuracy = np.mean(np.argmax(data.probabilities(), axis=1) == data.labels)
    fitted_accuracy = np.mean(perm.argsort()[model.most_likely_component(data.X)] == data.labels)
    assert abs(fitted_accuracy - true_accuracy) <= 0.01
    assert model.gate_converged_


def test_gated_fit_on_concomitant_columns_and_its_errors() -> None:
    data = make_gated(n_samples=2000, n_features=2, n_components=2, n_concomitant=3, random_state=1)
    model = MixtureOfLinearRegressions(n_components=2, gating=True, random_state=0)
    model.fit(data.X, data.y, concomitant=data.concomitant)
    assert model.gate_coef_.shape == (2, 3)
    assert not model.gate_on_features_
    probabilities = model.predict_proba(data.X[:5], data.concomitant[:5])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="pass them as Z"):
        model.predict_proba(data.X[:5])
    with pytest.raises(ValueError, match="fitted on 3 columns"):
        model.predict_proba(data.X[:5], data.concomitant[:5, :2])
    with pytest.raises(ValueError, match=r"concomitant\[2\]\[1\] is nan"):
        bad = data.concomitant[:5].copy()
        bad[2, 1] = np.nan
        model.predict_proba(data.X[:5], bad)
    with pytest.raises(ValueError, match="gating=False"):
        MixtureOfLinearRegressions(n_components=2).fit(data.X, data.y, concomitant=data.concomitant)
    with pytest.raises(ValueError, match="has no gate"):
        MixtureOfLinearRegressions(n_components=2, random_state=0).fit(
            data.X, data.y
        ).predict_proba(data.X)


def test_predictions_follow_their_definitions() -> None:
    data = make_gated(n_samples=1500, n_features=2, n_components=3, random_state=2)
    model = MixtureOfLinearRegressions(n_components=3, gating=True, random_state=0).fit(
        data.X, data.y
    )
    values = model.predict(data.X)
    probabilities = model.predict_proba(data.X)
    logits = data.X @ model.gate_coef_.T + model.gate_intercept_
    twin = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, twin, rtol=1e-12)
    np.testing.assert_allclose(model.predict_expected(data.X), (values * twin).sum(axis=1))
    chosen = model.most_likely_component(data.X)
    np.testing.assert_array_equal(chosen, np.argmax(twin, axis=1))
    np.testing.assert_array_equal(
        model.predict_most_likely(data.X), values[np.arange(len(chosen)), chosen]
    )
    # The log-likelihood, written out with scipy's normal density, is the fit's.
    density = stats.norm.pdf(data.y[:, None], values, np.sqrt(model.noise_variance_))
    twin_log_likelihood = float(np.log((twin * density).sum(axis=1)).sum())
    assert model.gated_log_likelihood(data.X, data.y) == pytest.approx(twin_log_likelihood)
    assert model.log_likelihood_ == pytest.approx(twin_log_likelihood)
    n_parameters = 3 * 3 + 3 + 2 * 3
    assert model.bic_ == pytest.approx(-2 * twin_log_likelihood + n_parameters * np.log(1500))
    np.testing.assert_array_equal(model.gate_coef_[0], 0.0)
    assert model.gate_intercept_[0] == 0.0
    np.testing.assert_allclose(model.weights_, twin.mean(axis=0))


def test_gated_fit_is_deterministic_under_a_seed() -> None:
    data = make_gated(n_samples=800, n_features=2, n_components=2, random_state=3)
    fits = [
        MixtureOfLinearRegressions(n_components=2, gating=True, random_state=11).fit(data.X, data.y)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(fits[0].gate_coef_, fits[1].gate_coef_)
    np.testing.assert_array_equal(fits[0].coef_, fits[1].coef_)
    assert fits[0].log_likelihood_ == fits[1].log_likelihood_


def test_one_component_gate_is_trivial() -> None:
    rng = np.random.default_rng(4)
    X = rng.standard_normal((300, 2))
    y = X @ np.array([1.0, -2.0]) + 0.5 + 0.3 * rng.standard_normal(300)
    model = MixtureOfLinearRegressions(n_components=1, gating=True, random_state=0).fit(X, y)
    np.testing.assert_array_equal(model.predict_proba(X), 1.0)
    np.testing.assert_allclose(model.predict_expected(X), model.predict(X)[:, 0])
    residual = y - model.predict(X)[:, 0]
    variance = float(np.mean(residual**2))
    assert model.noise_variance_[0] == pytest.approx(variance)
    assert model.log_likelihood_ == pytest.approx(
        float(stats.norm.logpdf(residual, 0.0, np.sqrt(variance)).sum())
    )


def test_model_document_carries_the_gate() -> None:
    data = make_gated(n_samples=600, n_features=2, n_components=2, n_concomitant=2, random_state=5)
    model = MixtureOfLinearRegressions(n_components=2, gating=True, random_state=0).fit(
        data.X, data.y, concomitant=data.concomitant
    )
    document = model.to_dict(feature_names=["a", "b"], concomitant_names=["w1", "w2"])
    assert document["gate"]["concomitant"] == ["w1", "w2"]
    copy = MixtureOfLinearRegressions.from_dict(document)
    np.testing.assert_array_equal(
        copy.predict_proba(data.X, data.concomitant),
        model.predict_proba(data.X, data.concomitant),
    )
    assert copy.gated_log_likelihood(data.X, data.y, data.concomitant) == (
        model.gated_log_likelihood(data.X, data.y, data.concomitant)
    )
    plain = MixtureOfLinearRegressions(n_components=2, random_state=0).fit(data.X, data.y)
    assert plain.to_dict()["gate"] is None
    broken = {**document, "gate": {**document["gate"], "coef": [[0.0], [1.0]]}}
    with pytest.raises(ValueError, match=r"gate\.coef"):
        MixtureOfLinearRegressions.from_dict(broken)


def test_refitting_without_a_gate_drops_the_gate() -> None:
    data = make_gated(n_samples=500, n_features=2, n_components=2, random_state=6)
    model = MixtureOfLinearRegressions(n_components=2, gating=True, random_state=0)
    model.fit(data.X, data.y)
    model.set_params(gating=False).fit(data.X, data.y)
    assert not hasattr(model, "gate_coef_")
    with pytest.raises(ValueError, match="has no gate"):
        model.predict_expected(data.X)


def test_gated_log_densities_match_a_loop_twin() -> None:
    rng = np.random.default_rng(8)
    Z = np.column_stack([rng.standard_normal((20, 2)), np.ones(20)])
    y = rng.standard_normal(20)
    W = np.column_stack([rng.standard_normal((20, 1)), np.ones(20)])
    theta, beta = rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    variances = np.array([0.5, 1.0, 2.0])
    log_joint, row = gated_log_densities(Z, y, W, theta, variances, beta)
    for i in range(20):
        weights = np.exp(W[i] @ beta.T) / np.exp(W[i] @ beta.T).sum()
        joint = weights * stats.norm.pdf(y[i], theta @ Z[i], np.sqrt(variances))
        np.testing.assert_allclose(np.exp(log_joint[i]), joint, rtol=1e-12)
        assert row[i] == pytest.approx(np.log(joint.sum()), rel=1e-12)


def test_a_spent_time_budget_still_fits_the_gate_once() -> None:
    data = make_gated(n_samples=400, n_features=2, n_components=2, random_state=9)
    model = MixtureOfLinearRegressions(
        n_components=2, algorithm="am-classic", gating=True, time_budget=1e-9, random_state=0
    ).fit(data.X, data.y)
    assert model.gate_n_iter_ == 1 and not model.gate_converged_
    assert np.ptp(model.predict_proba(data.X)[:, 0]) > 0.1


@pytest.mark.parametrize(("seed", "n_components"), [(0, 2), (1, 3), (2, 3), (3, 4)])
def test_one_newton_step_per_iteration_reaches_the_maximum_of_more_steps(
    seed: int, n_components: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gated EM takes one Newton step of the gate per iteration: it ends where EM with the
    gate fitted to convergence at every iteration ends, to EM's tolerance (1e-8 per row)."""
    data = make_gated(
        n_samples=200, n_components=n_components, n_concomitant=2, noise=0.3, random_state=seed
    )

    def fitted(steps: int) -> MixtureOfLinearRegressions:
        monkeypatch.setattr(gate_module, "_NEWTON_STEPS", steps)
        model = MixtureOfLinearRegressions(
            n_components=n_components, algorithm="am-classic", gating=True, random_state=seed
        )
        return model.fit(data.X, data.y, concomitant=data.concomitant)

    one, many = fitted(1), fitted(20)
    assert one.log_likelihood_ >= many.log_likelihood_ - 1e-6 * data.y.size
    np.testing.assert_allclose(one.coef_, many.coef_, atol=1e-3)
    np.testing.assert_allclose(one.gate_coef_, many.gate_coef_, atol=1e-2)
