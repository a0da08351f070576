"""Standard errors, intervals, bootstrap and the order of the lines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.exceptions import NotFittedError

from mixreg import MixtureOfLinearRegressions
from mixreg import _inference as inference
from mixreg._inference import (
    MixtureParameters,
    covariance_from_information,
    likelihood_pass,
    log_likelihood,
    match_lines,
    maximum_likelihood_polish,
    observed_information,
    row_scores,
)
from mixreg.service_support import component_order


def _mixture_rows(rng, n, coef, intercept, noise, weights=None):
    k, d = coef.shape
    X = rng.standard_normal((n, d))
    lines = rng.choice(k, size=n, p=weights)
    y = (X * coef[lines]).sum(axis=1) + intercept[lines] + noise * rng.standard_normal(n)
    return X, y


@pytest.fixture
def design_and_parameters():
    rng = np.random.default_rng(3)
    n, d, k = 200, 2, 3
    Z = np.column_stack([rng.standard_normal((n, d)), np.ones(n)])
    theta = rng.standard_normal((k, d + 1))
    y = (Z @ theta.T)[np.arange(n), rng.integers(0, k, n)] + 0.3 * rng.standard_normal(n)
    # Away from the maximum, so the score is not zero and every term of Louis's identity counts.
    params = MixtureParameters(theta + 0.1, np.array([0.2, 0.3, 0.5]), np.array([0.1, 0.2, 0.3]))
    return Z, y, params, rng.uniform(0.5, 2.0, n)


def _central_differences(function, vector, step=1e-5):
    return np.array(
        [
            (function(vector + step * unit) - function(vector - step * unit)) / (2 * step)
            for unit in np.eye(vector.size)
        ]
    )


def test_scores_are_the_gradient_of_the_log_likelihood(design_and_parameters):
    Z, y, params, weights = design_and_parameters
    k = params.n_components

    def weighted_log_likelihood(vector):
        return log_likelihood(Z, y, MixtureParameters.from_vector(vector, k), weights)

    numeric = _central_differences(weighted_log_likelihood, params.to_vector())
    analytic = weights @ row_scores(Z, y, params)
    assert np.abs(analytic).max() > 1.0
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-5)


def test_information_is_minus_the_hessian_of_the_log_likelihood(design_and_parameters):
    Z, y, params, weights = design_and_parameters
    k = params.n_components

    def weighted_score(vector):
        return weights @ row_scores(Z, y, MixtureParameters.from_vector(vector, k))

    numeric = -_central_differences(weighted_score, params.to_vector())
    information = observed_information(Z, y, params, weights)
    np.testing.assert_allclose(information, information.T, atol=1e-9)
    np.testing.assert_allclose(information, numeric, rtol=1e-5, atol=1e-4)


def test_integer_weights_give_the_information_of_repeated_rows(design_and_parameters):
    Z, y, params, _ = design_and_parameters
    counts = np.arange(Z.shape[0]) % 3
    repeated = np.repeat(np.arange(Z.shape[0]), counts)
    np.testing.assert_allclose(
        observed_information(Z, y, params, counts.astype(float)),
        observed_information(Z[repeated], y[repeated], params),
        rtol=1e-10,
        atol=1e-8,
    )


def test_one_pass_gives_the_log_likelihood_score_and_information(design_and_parameters):
    Z, y, params, weights = design_and_parameters
    evaluated = likelihood_pass(Z, y, params, weights)
    np.testing.assert_allclose(
        evaluated.log_likelihood, log_likelihood(Z, y, params, weights), rtol=1e-13
    )
    np.testing.assert_allclose(evaluated.score, weights @ row_scores(Z, y, params), rtol=1e-11)
    np.testing.assert_allclose(
        evaluated.information, observed_information(Z, y, params, weights), rtol=1e-13
    )


@pytest.mark.parametrize("k", [2, 3])
def test_newton_finish_reaches_the_fit_of_em_to_a_tight_tolerance(k):
    # Overlapping lines: EM crawls, so Newton takes over from it.
    rng = np.random.default_rng(11)
    coef = np.array([[1.0, -0.5], [0.4, 0.3], [-0.8, 0.6]])[:k]
    X, y = _mixture_rows(rng, 400, coef, np.array([0.0, 0.8, -0.5])[:k], 0.6)
    Z = np.column_stack([X, np.ones(400)])
    start = np.column_stack([coef, np.zeros(k)]) + 0.2
    fast = maximum_likelihood_polish(Z, y, start)
    plain = maximum_likelihood_polish(Z, y, start, tol=1e-15, max_iter=100_000, newton_finish=False)
    assert fast.at_maximum is not None and fast.converged and plain.converged
    assert fast.n_newton >= 1 and fast.n_iter < plain.n_iter
    plain_pass = likelihood_pass(Z, y, plain.params)
    # Newton ends nearer the maximum than EM's slow crawl does (its score is the smaller), so
    # the two agree to EM's own precision.
    assert np.max(np.abs(fast.at_maximum.score)) <= np.max(np.abs(plain_pass.score)) + 1e-9
    assert fast.at_maximum.log_likelihood >= plain_pass.log_likelihood - 1e-9
    np.testing.assert_allclose(fast.params.theta, plain.params.theta, atol=1e-5)
    np.testing.assert_allclose(fast.params.weights, plain.params.weights, atol=1e-5)
    np.testing.assert_allclose(fast.params.variances, plain.params.variances, rtol=1e-5)
    plain_se = np.sqrt(np.diag(covariance_from_information(plain_pass.information)))
    fast_se = np.sqrt(np.diag(covariance_from_information(fast.at_maximum.information)))
    np.testing.assert_allclose(fast_se, plain_se, rtol=5e-6)


def test_polish_is_em_where_em_converges_quickly():
    rng = np.random.default_rng(4)
    coef = np.array([[3.0, -1.0], [-3.0, 1.0]])
    X, y = _mixture_rows(rng, 300, coef, np.array([0.0, 5.0]), 0.3)
    Z = np.column_stack([X, np.ones(300)])
    start = np.column_stack([coef, [0.0, 5.0]])
    fast = maximum_likelihood_polish(Z, y, start)
    plain = maximum_likelihood_polish(Z, y, start, newton_finish=False)
    assert fast.converged and fast.n_newton == 0 and fast.n_iter == plain.n_iter
    np.testing.assert_array_equal(fast.params.theta, plain.params.theta)


def test_polish_falls_back_to_em_where_newton_cannot_finish(monkeypatch):
    # A line far from every row keeps no mass: the information is singular, so no Newton step
    # exists and the polish is EM's to the tight tolerance. Newton takes over after one EM step.
    monkeypatch.setattr(inference, "NEWTON_AFTER", 1)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 2))
    y = X @ [1.0, -2.0] + 0.5 + 0.3 * rng.standard_normal(200)
    Z = np.column_stack([X, np.ones(200)])
    start = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 1e6]])
    fast = maximum_likelihood_polish(Z, y, start)
    plain = maximum_likelihood_polish(Z, y, start, newton_finish=False)
    assert fast.at_maximum is None and fast.n_newton == 0
    assert fast.n_iter == plain.n_iter + 1  # the one step before Newton was tried, then EM's
    np.testing.assert_array_equal(fast.params.theta, plain.params.theta)
    np.testing.assert_array_equal(fast.params.weights, plain.params.weights)
    assert covariance_from_information(observed_information(Z, y, fast.params)) is None


def test_one_line_has_the_least_squares_standard_errors():
    # With k = 1 the ML fit is least squares with s^2 = RSS / n; the information gives
    # se(beta) = sqrt(s^2 diag((Z'Z)^-1)) and se(s^2) = s^2 sqrt(2 / n), by hand.
    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 2)) * [1.0, 10.0] + [5.0, -3.0]
    y = X @ [2.0, -0.5] + 1.0 + 0.7 * rng.standard_normal(300)
    fitted = MixtureOfLinearRegressions(1, standard_errors=True, random_state=0).fit(X, y)
    Z = np.column_stack([X, np.ones(300)])
    beta, rss, *_ = np.linalg.lstsq(Z, y, rcond=None)
    variance = rss[0] / 300
    se = np.sqrt(variance * np.diag(np.linalg.inv(Z.T @ Z)))
    np.testing.assert_allclose(fitted.ml_coef_[0], beta[:2], rtol=1e-8)
    np.testing.assert_allclose(fitted.coef_se_[0], se[:2], rtol=1e-6)
    np.testing.assert_allclose(fitted.intercept_se_, se[2:], rtol=1e-6)
    np.testing.assert_allclose(fitted.noise_variance_, [variance], rtol=1e-8)
    np.testing.assert_allclose(fitted.noise_variance_se_, [variance * np.sqrt(2 / 300)], rtol=1e-6)
    np.testing.assert_array_equal(fitted.weights_se_, [0.0])


def _coverage(k, n, replications, seed):
    coef = np.array([[3.0, -1.0], [-3.0, 1.0], [0.0, 4.0]])[:k]
    intercept = np.array([0.0, 5.0, -6.0])[:k]
    rng = np.random.default_rng(seed)
    covered = []
    for _ in range(replications):
        X, y = _mixture_rows(rng, n, coef, intercept, noise=1.0)
        fitted = MixtureOfLinearRegressions(
            k, algorithm="am-classic", n_init=5, standard_errors=True, random_state=rng
        ).fit(X, y)
        intervals = fitted.confidence_intervals(0.95)
        truth = np.column_stack([coef, intercept])
        order = match_lines(truth, np.column_stack([fitted.ml_coef_, fitted.ml_intercept_]))
        low = np.column_stack([intervals["coef"][order, :, 0], intervals["intercept"][order, 0]])
        high = np.column_stack([intervals["coef"][order, :, 1], intervals["intercept"][order, 1]])
        covered.append(((low <= truth) & (truth <= high)).ravel())
    return np.concatenate(covered)


def test_95_percent_intervals_cover_the_true_lines():
    # 20 replications of k = 2 and of k = 3 lines (n = 500): 120 + 180 intervals. If they
    # cover with probability 0.95 the binomial sd of the pooled rate is 0.013 (more with the
    # correlation of one fit's intervals): 0.915-0.985 is about 2.8 sd. On these replications
    # the intervals cover 0.953; made 20 % too narrow they would cover 0.887, out of the band.
    covered = np.concatenate([_coverage(2, 500, 20, seed=11), _coverage(3, 500, 20, seed=12)])
    assert 0.915 <= covered.mean() <= 0.985


def test_standard_errors_and_bootstrap_are_deterministic_under_a_seed():
    rng = np.random.default_rng(2)
    X, y = _mixture_rows(rng, 400, np.array([[2.0], [-2.0]]), np.array([0.0, 3.0]), noise=0.5)
    runs = []
    for _ in range(2):
        fitted = MixtureOfLinearRegressions(2, standard_errors=True, random_state=7).fit(X, y)
        boot = fitted.bootstrap(X, y, n_bootstrap=20, kind="empirical", random_state=3)
        runs.append((fitted.coef_se_, fitted.covariance_, boot.coef))
    for first, second in zip(*runs, strict=True):
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("kind", ["parametric", "empirical"])
def test_bootstrap_agrees_with_the_information(kind):
    rng = np.random.default_rng(4)
    X, y = _mixture_rows(
        rng, 600, np.array([[2.0, 1.0], [-2.0, 0.5]]), np.array([0.0, 4.0]), noise=0.8
    )
    fitted = MixtureOfLinearRegressions(2, standard_errors=True, random_state=1).fit(X, y)
    seen = []
    boot = fitted.bootstrap(
        X, y, n_bootstrap=150, kind=kind, random_state=5, progress=lambda f, i: seen.append(f)
    )
    assert seen[-1] == 1.0 and len(seen) == 150
    assert boot.n_converged == 150
    # 150 replicates estimate a standard deviation to about 6 %: 25 % is 4 of those.
    np.testing.assert_allclose(boot.coef_se, fitted.coef_se_, rtol=0.25)
    np.testing.assert_allclose(boot.intercept_se, fitted.intercept_se_, rtol=0.25)
    # Replicates are matched to the fitted lines: each stays near its own line.
    assert np.all(np.abs(boot.coef - fitted.ml_coef_).max(axis=0) < 10 * fitted.coef_se_)
    low, high = boot.coef_interval[..., 0], boot.coef_interval[..., 1]
    assert np.all(low < fitted.ml_coef_) and np.all(fitted.ml_coef_ < high)


def test_bootstrap_stops_when_its_progress_raises():
    rng = np.random.default_rng(4)
    X, y = _mixture_rows(rng, 200, np.array([[2.0], [-2.0]]), np.array([0.0, 4.0]), noise=0.5)
    fitted = MixtureOfLinearRegressions(2, random_state=1).fit(X, y)
    done = []

    def cancel_after_three(fraction, info):
        done.append(info["iteration"])
        if info["iteration"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fitted.bootstrap(X, y, n_bootstrap=50, progress=cancel_after_three)
    assert done == [1, 2, 3]


def test_summary_is_the_wald_table_of_the_standard_errors():
    rng = np.random.default_rng(8)
    X, y = _mixture_rows(rng, 300, np.array([[1.0], [-1.0]]), np.array([0.0, 3.0]), noise=0.3)
    fitted = MixtureOfLinearRegressions(2, standard_errors=True, random_state=0).fit(X, y)
    table = fitted.summary(level=0.9, feature_names=["dose"])
    assert [row.parameter for row in table.rows[:4]] == [
        "dose",
        "(Intercept)",
        "weight",
        "noise_variance",
    ]
    dose = table.rows[0]
    assert dose.estimate == fitted.ml_coef_[0, 0]
    assert dose.std_error == pytest.approx(fitted.coef_se_[0, 0])
    assert dose.z_value == pytest.approx(dose.estimate / dose.std_error)
    assert dose.p_value == pytest.approx(2 * norm.sf(abs(dose.z_value)))
    assert dose.lower == pytest.approx(dose.estimate - norm.ppf(0.95) * dose.std_error)
    assert fitted.confidence_intervals(0.9)["coef"][0, 0, 1] == pytest.approx(dose.upper)
    assert table.rows[2].z_value is None
    text = str(table)
    assert "$Comp.0" in text and "$Comp.1" in text and "Pr(>|z|)" in text
    assert len(table.to_records()) == 8
    with pytest.raises(ValueError, match="level"):
        fitted.summary(level=1.5)
    with pytest.raises(NotFittedError, match="standard_errors=True"):
        MixtureOfLinearRegressions(2).fit(X, y).summary()


def test_order_depends_only_on_the_set_of_lines():
    rng = np.random.default_rng(6)
    coef = rng.standard_normal((4, 3))
    intercept = rng.standard_normal(4)
    shares = np.array([0.25, 0.25, 0.4, 0.1])  # a tie, broken by the value at the mean
    x_mean = rng.standard_normal(3)
    reference = component_order(coef, intercept, shares, x_mean)
    assert reference[0] == 2 and reference[-1] == 3
    values = intercept + coef @ x_mean
    assert values[reference[1]] > values[reference[2]]
    # Moving the features' origin moves every intercept, not the order.
    shift = np.array([100.0, -50.0, 7.0])
    shifted = component_order(coef, intercept - coef @ shift, shares, x_mean + shift)
    np.testing.assert_array_equal(shifted, reference)
    for permutation in itertools.permutations(range(4)):
        perm = np.array(permutation)
        order = component_order(coef[perm], intercept[perm], shares[perm], x_mean)
        np.testing.assert_array_equal(coef[perm][order], coef[reference])


def test_fitted_lines_and_their_errors_come_in_the_documented_order():
    rng = np.random.default_rng(9)
    X, y = _mixture_rows(
        rng,
        600,
        np.array([[1.0], [-1.0], [0.0]]),
        np.array([0.0, 6.0, -6.0]),
        0.3,
        weights=[0.5, 0.3, 0.2],
    )
    fitted = MixtureOfLinearRegressions(3, standard_errors=True, random_state=0).fit(X, y)
    assert np.all(np.diff(fitted.shares_) <= 0)
    np.testing.assert_allclose(fitted.ml_intercept_, [0.0, 6.0, -6.0], atol=0.3)
    np.testing.assert_allclose(fitted.weights_, [0.5, 0.3, 0.2], atol=0.06)


def test_match_lines_undoes_a_permutation():
    rng = np.random.default_rng(1)
    lines = rng.standard_normal((5, 3))
    permutation = rng.permutation(5)
    shuffled = lines[permutation] + 1e-3 * rng.standard_normal((5, 3))
    np.testing.assert_allclose(shuffled[match_lines(lines, shuffled)], lines, atol=1e-2)
