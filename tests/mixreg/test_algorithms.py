"""Every algorithm: recovery on realizable data, Algorithm 1's step, seeding, budget, progress."""

import itertools
import time

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from mixreg import ALGORITHMS, DegenerateFitWarning, MixtureOfLinearRegressions
from mixreg.datasets import make_friedman, make_realizable

NOISE = 0.1

# Features per (k, fit_intercept): at most 3 parameters per line keeps the sub-sample small.
N_FEATURES = {(2, True): 2, (2, False): 2, (3, True): 1, (3, False): 2}

SUBSAMPLE = {
    2: {"subsample_size": 8, "n_partitions": 1000},
    3: {"subsample_size": 9, "n_partitions": 5000},
}

# Small settings under which each algorithm, applied to a tiny problem, still works.
# tol=0 runs exactly max_iter iterations, without a convergence warning.
QUICK_SETTINGS = {
    "auto": {"n_init": 6, "subsample_size": 20, "n_partitions": 50},
    "am": {"max_iter": 30, "tol": 0.0},
    "am-classic": {"max_iter": 30},
    "subsample": {"subsample_size": 20, "n_partitions": 200},
    "subsample-exhaustive": {"subsample_size": 10},
    "subsample+am": {"subsample_size": 20, "n_partitions": 200, "max_iter": 30, "tol": 0.0},
    "em": {"max_iter": 30, "tol": 0.0},
}


def recovery_settings(name, n_components):
    if name in ("subsample", "subsample+am"):
        return {"algorithm": name, **SUBSAMPLE[n_components]}
    if name == "subsample-ransac":
        return {
            "algorithm": "subsample",
            "base": "ransac",
            "subsample_size": 30,
            "n_partitions": 300,
        }
    if name == "subsample-exhaustive":
        return {"algorithm": name, "subsample_size": 10}
    return {"algorithm": name, "n_init": 5}


def as_lines(coef, intercept):
    return np.column_stack([coef, intercept])


def matched_distances(estimator, coef, intercept):
    """Distance of each true line to the fitted line the Hungarian matching pairs it with."""
    fitted = as_lines(estimator.coef_, estimator.intercept_)
    truth = as_lines(coef, intercept)
    cost = np.linalg.norm(fitted[:, None, :] - truth[None, :, :], axis=2)
    rows, columns = linear_sum_assignment(cost)
    return cost[rows, columns]


RECOVERY_CASES = [
    (name, k, fit_intercept, seed)
    for name in (
        "subsample",
        "subsample+am",
        "am-classic",
        "em",
        "subsample-ransac",
        "subsample-exhaustive",
    )
    for k in (2, 3)
    for fit_intercept in (True, False)
    for seed in (0, 1)
    if not (name == "subsample-exhaustive" and k == 3)
]


@pytest.mark.parametrize(("name", "n_components", "fit_intercept", "seed"), RECOVERY_CASES)
def test_recovers_the_true_lines(name, n_components, fit_intercept, seed):
    X, y, coef, intercept, _ = make_realizable(
        300,
        N_FEATURES[n_components, fit_intercept],
        n_components,
        noise=NOISE,
        fit_intercept=fit_intercept,
        random_state=seed,
    )
    estimator = MixtureOfLinearRegressions(
        n_components,
        fit_intercept=fit_intercept,
        random_state=seed,
        **recovery_settings(name, n_components),
    ).fit(X, y)
    assert np.all(matched_distances(estimator, coef, intercept) < 0.15)
    if not fit_intercept:
        np.testing.assert_array_equal(estimator.intercept_, np.zeros(n_components))
    # Each row's best line is (nearly) its own, so the min-loss is about the noise variance.
    assert 0.5 * NOISE**2 < estimator.train_loss_ < 1.5 * NOISE**2
    assert estimator.min_loss(X, y) == pytest.approx(estimator.train_loss_)


def realizable_problem(n_components=2, fit_intercept=True, seed=3, n_samples=300):
    return make_realizable(
        n_samples, 2, n_components, noise=NOISE, fit_intercept=fit_intercept, random_state=seed
    )


def test_gradient_am_from_near_the_truth_converges_monotonically():
    X, y, coef, intercept, _ = realizable_problem()
    rng = np.random.default_rng(0)
    start = as_lines(coef, intercept) + rng.uniform(-0.3, 0.3, size=(2, 3))
    estimator = MixtureOfLinearRegressions(
        2, algorithm="am", init=start, step_size=0.4, max_iter=300, tol=0.0
    ).fit(X, y)
    history = estimator.loss_history_
    assert len(history) > 10
    assert np.all(np.diff(history) <= 1e-12 * history[:-1]), "the min-loss went up"
    assert history[-1] < 0.5 * history[0]
    fitted_distance = matched_distances(estimator, coef, intercept).max()
    start_distance = np.linalg.norm(start - as_lines(coef, intercept), axis=1).max()
    assert fitted_distance < 0.5 * start_distance


def test_gradient_am_from_the_truth_stays_close():
    X, y, coef, intercept, _ = realizable_problem()
    estimator = MixtureOfLinearRegressions(
        2, algorithm="am", init=as_lines(coef, intercept), step_size=0.4, max_iter=50, tol=0.0
    ).fit(X, y)
    assert np.all(matched_distances(estimator, coef, intercept) < 0.05)
    assert estimator.train_loss_ < 1.5 * NOISE**2


def one_gradient_step_by_hand(X, y, lines, step_size, fit_intercept):
    """theta_j - (gamma/n) sum_{i in S_j} grad F_i(theta_j) in the estimator's scaled space,
    with F_i(theta) = (y_i - <z_i, theta>)^2, mapped back to the caller's units.

    The scaled space: with an intercept each feature and y centred on their means; each
    feature divided by its standard deviation, then all by the largest row norm; y divided by
    its largest absolute value."""
    n, d = X.shape
    x_mean = X.mean(axis=0) if fit_intercept else np.zeros(d)
    y_mean = y.mean() if fit_intercept else 0.0
    centred = X - x_mean
    spread = np.sqrt((centred**2).mean(axis=0))
    standardized = centred / spread
    row_norm = max(np.linalg.norm(row) for row in standardized)
    x_scale = spread * row_norm
    y_scale = max(abs(value - y_mean) for value in y)
    Z = centred / x_scale
    if fit_intercept:
        Z = np.column_stack([Z, np.ones(n)])
    y_scaled = (y - y_mean) / y_scale
    theta = [line[:d] * x_scale / y_scale for line in lines]
    if fit_intercept:
        theta = [
            np.append(t, (line[d] + line[:d] @ x_mean - y_mean) / y_scale)
            for t, line in zip(theta, lines, strict=True)
        ]
    stepped = []
    for j, theta_j in enumerate(theta):
        gradient_sum = np.zeros_like(theta_j)
        for i in range(n):
            residuals = [y_scaled[i] - Z[i] @ t for t in theta]
            if int(np.argmin(np.abs(residuals))) == j:
                gradient_sum += -2.0 * Z[i] * residuals[j]
        stepped.append(theta_j - step_size / n * gradient_sum)
    coef = np.array([t[:d] * y_scale / x_scale for t in stepped])
    intercept = np.array(
        [
            y_mean + t[d] * y_scale - c @ x_mean if fit_intercept else 0.0
            for t, c in zip(stepped, coef, strict=True)
        ]
    )
    return as_lines(coef, intercept)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_one_gradient_am_step_follows_the_formula(fit_intercept):
    X, y, coef, intercept, _ = realizable_problem(fit_intercept=fit_intercept, n_samples=60)
    rng = np.random.default_rng(1)
    start_lines = as_lines(coef, intercept) + rng.normal(scale=1.0, size=(2, 3))
    if not fit_intercept:
        start_lines[:, 2] = 0.0
    init = start_lines if fit_intercept else start_lines[:, :2]
    estimator = MixtureOfLinearRegressions(
        2,
        algorithm="am",
        init=init,
        step_size=0.7,
        max_iter=1,
        tol=0.0,
        fit_intercept=fit_intercept,
    ).fit(X, y)
    expected = one_gradient_step_by_hand(X, y, start_lines, 0.7, fit_intercept)
    fitted = as_lines(estimator.coef_, estimator.intercept_)
    order = linear_sum_assignment(
        np.linalg.norm(fitted[:, None, :] - expected[None, :, :], axis=2)
    )[1]
    np.testing.assert_allclose(fitted, expected[order], rtol=1e-10, atol=1e-12)
    assert estimator.n_iter_ == 1
    assert len(estimator.loss_history_) == 2
    start_loss = np.mean(
        np.min((y[:, None] - X @ start_lines[:, :2].T - start_lines[:, 2]) ** 2, axis=1)
    )
    assert estimator.loss_history_[0] == pytest.approx(start_loss, rel=1e-10)
    assert estimator.loss_history_[1] == pytest.approx(estimator.train_loss_, rel=1e-10)


@pytest.fixture(scope="module")
def nonrealizable_data():
    X, y, _, _ = make_friedman(1, n_train=200, n_test=1, random_state=0)
    return X, y


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [(name, {}) for name in ALGORITHMS]
    + [("subsample", {"base": "ransac", "subsample_size": 30, "n_partitions": 30})],
)
def test_same_seed_same_fit_and_seeds_matter(nonrealizable_data, algorithm, extra):
    X, y = nonrealizable_data
    settings = {**QUICK_SETTINGS[algorithm], **extra}

    def fit(seed):
        return MixtureOfLinearRegressions(
            3, algorithm=algorithm, random_state=seed, **settings
        ).fit(X, y)

    first, again = fit(0), fit(0)
    np.testing.assert_array_equal(first.coef_, again.coef_)
    np.testing.assert_array_equal(first.intercept_, again.intercept_)
    np.testing.assert_array_equal(first.loss_history_, again.loss_history_)
    others = [fit(seed) for seed in (1, 2, 3)]
    if algorithm == "auto":
        # The search is thorough enough that every seed may end at the same lines on 200 rows;
        # the seed still draws different candidates.
        assert any(first.candidates_ != other.candidates_ for other in others)
    else:
        assert any(not np.array_equal(first.coef_, other.coef_) for other in others)


def test_a_generator_as_random_state_is_used_as_is(nonrealizable_data):
    X, y = nonrealizable_data
    settings = QUICK_SETTINGS["subsample"]
    from_int = MixtureOfLinearRegressions(2, algorithm="subsample", random_state=5, **settings).fit(
        X, y
    )
    from_generator = MixtureOfLinearRegressions(
        2, algorithm="subsample", random_state=np.random.default_rng(5), **settings
    ).fit(X, y)
    np.testing.assert_array_equal(from_int.coef_, from_generator.coef_)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_components_are_ordered_by_share_and_shares_sum_to_one(nonrealizable_data, algorithm):
    X, y = nonrealizable_data
    estimator = MixtureOfLinearRegressions(
        3, algorithm=algorithm, random_state=0, **QUICK_SETTINGS[algorithm]
    ).fit(X, y)
    shares = estimator.shares_
    assert shares.shape == (3,)
    assert shares.sum() == pytest.approx(1.0)
    assert np.all(np.diff(shares) <= 0)
    # The shares are the fractions of rows each line predicts best.
    best = np.argmin(np.abs(estimator.predict(X) - y[:, None]), axis=1)
    np.testing.assert_allclose(shares, np.bincount(best, minlength=3) / len(y))
    assert estimator.coef_.shape == (3, X.shape[1])
    assert estimator.intercept_.shape == (3,)
    assert np.all(np.isfinite(estimator.coef_)) and np.all(np.isfinite(estimator.intercept_))
    assert estimator.train_loss_ == pytest.approx(estimator.min_loss(X, y))
    # The history ends with the min-loss of the returned lines, in the caller's units.
    assert estimator.loss_history_[-1] == pytest.approx(estimator.train_loss_, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["am", "am-classic", "em"])
def test_a_line_that_wins_no_rows_stays_finite_with_share_zero(algorithm):
    X, y, coef, intercept, _ = realizable_problem()
    far_line = np.array([0.0, 0.0, 1e3])
    init = np.vstack([as_lines(coef, intercept), far_line])
    # Such a fit is degenerate, and says so.
    with pytest.warns(DegenerateFitWarning, match="1 of the 3 lines own fewer than the 4"):
        estimator = MixtureOfLinearRegressions(3, algorithm=algorithm, init=init, max_iter=20)
        estimator.fit(X, y)
    assert np.all(np.isfinite(estimator.coef_)) and np.all(np.isfinite(estimator.intercept_))
    assert estimator.shares_[-1] == 0.0
    assert np.all(estimator.shares_[:2] > 0.4)
    if algorithm != "em":
        # AM never moves a line without rows (zero gradient, or no rows to refit on).
        np.testing.assert_allclose(
            as_lines(estimator.coef_, estimator.intercept_)[-1], far_line, rtol=1e-12
        )


def test_time_budget_stops_a_long_subsample_search_early():
    X, y, *_ = realizable_problem(n_samples=2000)
    n_partitions = 10**6
    started = time.monotonic()
    estimator = MixtureOfLinearRegressions(
        2,
        algorithm="subsample",
        subsample_size=20,
        n_partitions=n_partitions,
        time_budget=0.05,
        random_state=0,
    ).fit(X, y)
    elapsed = time.monotonic() - started
    assert 0 < estimator.n_iter_ < n_partitions
    assert estimator.n_candidates_ == estimator.n_iter_
    assert elapsed < 5.0
    assert np.all(np.isfinite(estimator.coef_)) and np.all(np.isfinite(estimator.intercept_))
    assert np.isfinite(estimator.train_loss_)


@pytest.mark.parametrize("algorithm", ["am", "em", "subsample+am"])
def test_time_budget_stops_iterative_algorithms_early(algorithm):
    X, y, *_ = realizable_problem(n_samples=2000)
    settings = {"max_iter": 10**6, "tol": 0.0, "time_budget": 0.05, "random_state": 0}
    if algorithm == "subsample+am":
        settings.update(subsample_size=20, n_partitions=10**6)
    estimator = MixtureOfLinearRegressions(2, algorithm=algorithm, **settings).fit(X, y)
    assert estimator.n_iter_ < 10**6
    assert np.all(np.isfinite(estimator.coef_))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_progress_reports_increasing_fractions_ending_at_one(nonrealizable_data, algorithm):
    X, y = nonrealizable_data
    calls = []
    estimator = MixtureOfLinearRegressions(
        2, algorithm=algorithm, random_state=0, **QUICK_SETTINGS[algorithm]
    ).fit(X, y, progress=lambda fraction, info: calls.append((fraction, dict(info))))
    fractions = [fraction for fraction, _ in calls]
    assert len(calls) >= 2
    assert all(0.0 <= fraction <= 1.0 for fraction in fractions)
    assert all(later >= earlier for earlier, later in itertools.pairwise(fractions))
    assert fractions[-1] == 1.0
    for _, info in calls:
        assert set(info) >= {"iteration", "candidates_tried", "best_loss"}
    final = calls[-1][1]
    assert final["best_loss"] == pytest.approx(estimator.train_loss_)


class FitCancelledError(Exception):
    pass


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_exception_in_progress_aborts_the_fit(nonrealizable_data, algorithm):
    X, y = nonrealizable_data
    calls = []

    def progress(fraction, info):
        calls.append(fraction)
        raise FitCancelledError

    estimator = MixtureOfLinearRegressions(
        2, algorithm=algorithm, random_state=0, **QUICK_SETTINGS[algorithm]
    )
    with pytest.raises(FitCancelledError):
        estimator.fit(X, y, progress=progress)
    assert len(calls) == 1
    assert calls[0] < 1.0, "the fit ran to its end before reporting progress"
    assert not hasattr(estimator, "coef_")


def test_em_reports_mixture_weights_and_noise_variances_in_the_callers_units():
    X, y, coef, intercept, _ = realizable_problem(n_samples=600)
    scale = 50.0  # caller units far from the scaled space
    estimator = MixtureOfLinearRegressions(2, algorithm="em", n_init=3, random_state=0).fit(
        X, scale * y
    )
    assert np.all(matched_distances(estimator, scale * coef, scale * intercept) < 0.15 * scale)
    assert estimator.weights_.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(estimator.weights_, [0.5, 0.5], atol=0.05)
    np.testing.assert_allclose(estimator.noise_variance_, (scale * NOISE) ** 2, rtol=0.3)
