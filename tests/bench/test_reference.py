"""The plain reference algorithms used by the benchmark recover lines on realizable data."""

import itertools

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from bench.reference import (
    reference_gradient_am,
    reference_least_squares,
    reference_min_loss,
    reference_predict,
    reference_subsample,
)
from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_realizable


def _matched_error(coef, intercept, true_coef, true_intercept):
    """Largest parameter error under the best matching of found lines to true lines."""
    found = np.column_stack([coef, intercept])
    truth = np.column_stack([true_coef, true_intercept])
    k = truth.shape[0]
    return min(
        np.abs(found[list(order)] - truth).max() for order in itertools.permutations(range(k))
    )


def test_min_loss_matches_brute_force():
    rng = np.random.default_rng(0)
    y = rng.standard_normal(7)
    predictions = rng.standard_normal((7, 3))
    brute = sum(min((y[i] - predictions[i, j]) ** 2 for j in range(3)) for i in range(7)) / 7
    assert reference_min_loss(y, predictions) == pytest.approx(brute, rel=1e-12)


def test_predict_is_one_column_per_line():
    X = np.array([[1.0, 2.0], [3.0, -1.0]])
    coef = np.array([[1.0, 0.0], [0.5, 2.0]])
    intercept = np.array([10.0, -1.0])
    expected = np.array([[11.0, 3.5], [13.0, -1.5]])
    np.testing.assert_allclose(reference_predict(X, coef, intercept), expected)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_least_squares_baseline_is_ordinary_least_squares(fit_intercept):
    X, y, _, _, _ = make_realizable(n_samples=50, n_features=3, random_state=1)
    fit = reference_least_squares(X, y, fit_intercept=fit_intercept)
    design = np.column_stack([X, np.ones(50)]) if fit_intercept else X
    solution = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(fit.coef[0], solution[:3], rtol=1e-8, atol=1e-10)
    assert fit.intercept[0] == pytest.approx(solution[3] if fit_intercept else 0.0, abs=1e-8)
    assert fit.min_loss(X, y) == pytest.approx(np.mean((design @ solution - y) ** 2), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_subsample_with_ransac_recovers_two_lines(seed):
    X, y, coef, intercept, _ = make_realizable(
        n_samples=300, n_features=2, n_components=2, noise=0.01, random_state=seed
    )
    fit = reference_subsample(
        X, y, 2, subsample_size=60, n_partitions=15, base="ransac", random_state=seed
    )
    assert fit.n_candidates == 15
    assert _matched_error(fit.coef, fit.intercept, coef, intercept) < 0.01
    assert fit.min_loss(X, y) < 2 * 0.01**2


def test_subsample_with_ransac_finds_three_lines_approximately():
    # With three lines a random part holds about a third of each, and the single refit uses
    # RANSAC's median-absolute-deviation-of-y threshold, which keeps rows the candidate
    # misassigned near crossings: close to the truth, not exact.
    X, y, coef, intercept, _ = make_realizable(
        n_samples=300, n_features=2, n_components=3, noise=0.01, random_state=1
    )
    fit = reference_subsample(
        X, y, 3, subsample_size=60, n_partitions=15, base="ransac", random_state=1
    )
    assert _matched_error(fit.coef, fit.intercept, coef, intercept) < 0.25
    one_line = reference_least_squares(X, y).min_loss(X, y)
    assert fit.min_loss(X, y) < 0.002 * one_line
    assert fit.min_loss(X, y) < fit.loss_history[-1]


def test_subsample_with_least_squares_recovers_the_lines_from_a_pure_partition():
    # |A| = 8 points and 2 lines: 2 of the 256 labelings of A are the true split, so
    # 600 random partitions contain one with probability 99% (given A holds two points of
    # each line, as it does for this seed); its lines then fit all rows.
    X, y, coef, intercept, _ = make_realizable(
        n_samples=200, n_features=1, n_components=2, noise=0.01, random_state=3
    )
    fit = reference_subsample(X, y, 2, subsample_size=8, n_partitions=600, random_state=3)
    assert _matched_error(fit.coef, fit.intercept, coef, intercept) < 0.01
    # The best candidate was already as good as the refit lines.
    assert fit.loss_history[-1] < 2 * 0.01**2
    assert fit.loss_history == sorted(fit.loss_history, reverse=True)


def test_subsample_refit_is_least_squares_on_the_rows_each_line_wins():
    X, y, _, _, _ = make_realizable(n_samples=120, n_features=2, noise=0.5, random_state=4)
    fit = reference_subsample(X, y, 2, subsample_size=20, n_partitions=30, random_state=4)
    # The refit lines are the least squares of the rows the best candidate assigned to them,
    # so refitting on their own assignment cannot lower the loss by more than one AM step.
    winner = np.argmin((y[:, None] - fit.predict(X)) ** 2, axis=1)
    for j in range(2):
        rows = winner == j
        line = LinearRegression().fit(X[rows], y[rows])
        refit_loss = np.mean((y[rows] - line.predict(X[rows])) ** 2)
        own_loss = np.mean((y[rows] - fit.predict(X[rows])[:, j]) ** 2)
        assert refit_loss <= own_loss + 1e-12


def test_subsample_is_deterministic_under_a_seed():
    X, y, _, _, _ = make_realizable(n_samples=100, noise=0.3, random_state=5)
    first = reference_subsample(X, y, 2, subsample_size=20, n_partitions=10, random_state=7)
    second = reference_subsample(X, y, 2, subsample_size=20, n_partitions=10, random_state=7)
    np.testing.assert_array_equal(first.coef, second.coef)
    np.testing.assert_array_equal(first.intercept, second.intercept)


def test_subsample_rejects_an_unknown_base():
    X, y, _, _, _ = make_realizable(n_samples=30, random_state=0)
    with pytest.raises(ValueError, match="base must be 'ls' or 'ransac'"):
        reference_subsample(X, y, 2, subsample_size=10, n_partitions=2, base="huber")


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_gradient_am_from_near_the_truth_recovers_the_lines(fit_intercept):
    X, y, coef, intercept, _ = make_realizable(
        n_samples=400, n_features=2, noise=0.01, fit_intercept=fit_intercept, random_state=6
    )
    truth = np.column_stack([coef, intercept]) if fit_intercept else coef
    init = truth + 0.3 * np.random.default_rng(0).standard_normal(truth.shape)
    fit = reference_gradient_am(
        X, y, 2, step_size=1.0, max_iter=3000, tol=0.0, init=init, fit_intercept=fit_intercept
    )
    assert _matched_error(fit.coef, fit.intercept, coef, intercept) < 0.01
    if not fit_intercept:
        np.testing.assert_array_equal(fit.intercept, 0.0)


def test_gradient_am_step_decreases_the_loss_and_tol_stops_it():
    X, y, _, _, _ = make_realizable(n_samples=300, noise=0.2, random_state=8)
    fit = reference_gradient_am(X, y, 2, step_size=0.1, max_iter=500, tol=1e-3, random_state=2)
    history = np.array(fit.loss_history)
    assert np.all(np.diff(history) <= 1e-12)
    assert len(history) < 501
    assert abs(history[-2] - history[-1]) <= 1e-3 * history[-2]
    # The reported loss is the loss of the reported lines, in the caller's units.
    assert fit.min_loss(X, y) == pytest.approx(history[-1], rel=1e-9)


def test_gradient_am_is_deterministic_under_a_seed():
    X, y, _, _, _ = make_realizable(n_samples=100, noise=0.2, random_state=9)
    first = reference_gradient_am(X, y, 2, max_iter=20, random_state=3)
    second = reference_gradient_am(X, y, 2, max_iter=20, random_state=3)
    other = reference_gradient_am(X, y, 2, max_iter=20, random_state=4)
    np.testing.assert_array_equal(first.coef, second.coef)
    assert not np.array_equal(first.coef, other.coef)


def _sorted_lines(coef, intercept):
    lines = np.column_stack([coef, intercept])
    return lines[np.lexsort(lines.T[::-1])]


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_subsample_least_squares_matches_the_estimator_on_the_same_draws(fit_intercept):
    # With least squares the reference draws A and then each partition's labels from the same
    # generator in the same order as the estimator, so both score the same candidates: the
    # plain loop and the vectorized search must pick the same one and refit it identically.
    X, y, _, _, _ = make_realizable(
        n_samples=400, n_features=3, noise=2.0, fit_intercept=fit_intercept, random_state=10
    )
    estimator = MixtureOfLinearRegressions(
        n_components=2,
        algorithm="subsample",
        subsample_size=30,
        n_partitions=200,
        fit_intercept=fit_intercept,
        random_state=5,
    ).fit(X, y)
    fit = reference_subsample(
        X, y, 2, subsample_size=30, n_partitions=200, fit_intercept=fit_intercept, random_state=5
    )
    np.testing.assert_allclose(
        _sorted_lines(fit.coef, fit.intercept),
        _sorted_lines(estimator.coef_, estimator.intercept_),
        rtol=1e-7,
        atol=1e-9,
    )
    assert fit.min_loss(X, y) == pytest.approx(estimator.min_loss(X, y), rel=1e-9)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_gradient_am_matches_the_estimator_from_the_same_start(fit_intercept):
    X, y, _, _, _ = make_realizable(
        n_samples=300,
        n_features=2,
        n_components=3,
        noise=0.5,
        fit_intercept=fit_intercept,
        random_state=11,
    )
    n_params = 3 if fit_intercept else 2
    init = 5.0 * np.random.default_rng(1).standard_normal((3, n_params))
    estimator = MixtureOfLinearRegressions(
        n_components=3,
        algorithm="am",
        step_size=0.5,
        max_iter=40,
        tol=0.0,
        init=init,
        fit_intercept=fit_intercept,
    ).fit(X, y)
    fit = reference_gradient_am(
        X, y, 3, step_size=0.5, max_iter=40, tol=0.0, init=init, fit_intercept=fit_intercept
    )
    np.testing.assert_allclose(
        _sorted_lines(fit.coef, fit.intercept),
        _sorted_lines(estimator.coef_, estimator.intercept_),
        rtol=1e-8,
        atol=1e-10,
    )
    np.testing.assert_allclose(fit.loss_history, estimator.loss_history_, rtol=1e-9)
