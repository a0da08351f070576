"""Data people actually bring: features far from zero, wide tables, a dozen rows, degenerate
lines, sub-sample sizes at the API's limits."""

from __future__ import annotations

import itertools
import threading
import time
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression

from mixreg import (
    ALGORITHMS,
    DegenerateFitWarning,
    MixtureOfLinearRegressions,
    mixture_score,
    select_n_components,
)
from mixreg._auto import lines_of_random_rows
from mixreg._em import EMResult
from mixreg._loss import single_threaded_blas
from mixreg._selection import LIKELIHOOD_DROP_SLACK
from mixreg._solvers import FitContext, restarts

# Settings that keep each algorithm to a fraction of a second on a few dozen rows.
QUICK = {
    "auto": {"n_init": 6, "subsample_size": 20, "n_partitions": 40},
    "am": {"max_iter": 30, "tol": 0.0},
    "am-classic": {"max_iter": 30},
    "subsample": {"subsample_size": 20, "n_partitions": 100},
    "subsample-exhaustive": {"subsample_size": 8},
    "subsample+am": {"subsample_size": 20, "n_partitions": 100, "max_iter": 30, "tol": 0.0},
    "em": {"max_iter": 30, "tol": 0.0},
}


def lines_data(n_samples, n_features, n_lines, seed, noise=0.1):
    """Rows on ``n_lines`` random lines; X and y on a dyadic grid, so shifting them by a whole
    number below 2**31 is exact in float64 (the test then sees the fit's rounding, not the
    data's)."""
    rng = np.random.default_rng(seed)
    X = np.round(rng.uniform(-4, 4, size=(n_samples, n_features)) * 256) / 256
    slopes = rng.normal(scale=3.0, size=(n_lines, n_features))
    intercepts = rng.normal(scale=3.0, size=n_lines)
    owner = rng.integers(0, n_lines, size=n_samples)
    y = np.einsum("ij,ij->i", X, slopes[owner]) + intercepts[owner]
    y = np.round((y + noise * rng.standard_normal(n_samples)) * 256) / 256
    return X, y


def quiet_fit(estimator, X, y):
    with warnings.catch_warnings():
        # Random data of a few rows may leave a line with too few rows or stop an iterative
        # algorithm at max_iter: documented warnings, not the subject here.
        warnings.simplefilter("ignore", DegenerateFitWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y)


# --- 1. features far from zero ---


@pytest.mark.parametrize("offset", [1e3, 1e6, 1e9])
def test_a_feature_far_from_zero_gives_scikit_learns_line(offset):
    rng = np.random.default_rng(0)
    X = offset + rng.standard_normal((1000, 1))
    y = 2.0 * X[:, 0] + rng.normal(scale=0.01, size=1000)
    reference = LinearRegression().fit(X, y)
    reference_loss = float(np.mean((reference.predict(X) - y) ** 2))
    one = MixtureOfLinearRegressions(1, random_state=0).fit(X, y)
    np.testing.assert_allclose(one.coef_[0], reference.coef_, rtol=1e-8)
    assert one.intercept_[0] == pytest.approx(reference.intercept_, rel=1e-8, abs=1e-8 * offset)
    assert one.train_loss_ == pytest.approx(reference_loss, rel=1e-6)
    two = MixtureOfLinearRegressions(2, random_state=0).fit(X, y)
    # Two lines through one line's rows: both slopes near 2, a min-loss no worse than one.
    np.testing.assert_allclose(two.coef_[:, 0], 2.0, atol=2e-3)
    assert two.train_loss_ <= reference_loss * (1 + 1e-9)


# --- property: equivariance under affine changes, for every algorithm ---


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**16),
    n_features=st.integers(1, 2),
    n_components=st.integers(1, 5),
    shift=st.integers(-(10**9), 10**9),
    log_scale=st.integers(-20, 20),
    y_shift=st.integers(-(10**6), 10**6),
    y_log_scale=st.integers(-10, 10),
)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_predictions_follow_affine_changes_of_the_data(
    algorithm, seed, n_features, n_components, shift, log_scale, y_shift, y_log_scale
):
    X, y = lines_data(12 * n_components + 8, n_features, min(n_components, 3), seed)
    settings_ = dict(QUICK[algorithm])
    if algorithm == "subsample-exhaustive":
        # Every partition of a sub-sample: keep the count small for any k.
        settings_["subsample_size"] = {1: 10, 2: 10, 3: 8, 4: 7, 5: 7}[n_components]
    moved_X = X.copy()
    # Feature 0 shifted by up to 1e9, every feature scaled by 2^-20 ... 2^20 (1e-6 ... 1e6),
    # y shifted and scaled: all exactly (the data lie on a dyadic grid), so any difference
    # is the fit's own rounding, not the data's.
    moved_X[:, 0] += shift
    moved_X *= 2.0**log_scale
    y_scale = 2.0**y_log_scale
    moved_y = y * y_scale + y_shift
    fit = quiet_fit(
        MixtureOfLinearRegressions(n_components, algorithm=algorithm, random_state=0, **settings_),
        X,
        y,
    )
    moved = quiet_fit(
        MixtureOfLinearRegressions(n_components, algorithm=algorithm, random_state=0, **settings_),
        moved_X,
        moved_y,
    )
    expected = np.sort(fit.predict(X), axis=1)
    # Back to the original units of y: the same predictions, up to the order of the lines.
    got = np.sort((moved.predict(moved_X) - y_shift) / y_scale, axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * float(np.std(y)))
    # Losses are evaluated in the caller's units, where a feature at 1e9 costs the residuals
    # about seven digits (as it does LinearRegression's): equal to a looser tolerance.
    assert moved.train_loss_ == pytest.approx(
        fit.train_loss_ * y_scale**2, rel=1e-4, abs=1e-9 * float(np.var(moved_y))
    )


@settings(max_examples=4, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**16),
    n_features=st.integers(1, 3),
    n_components=st.integers(1, 5),
    shift=st.integers(-(10**9), 10**9),
    log_scale=st.integers(-20, 20),
)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_lines_refit_on_its_rows_is_linear_regression_on_them(
    algorithm, seed, n_features, n_components, shift, log_scale
):
    X, y = lines_data(15 * n_components + 10, n_features, min(n_components, 3), seed)
    X[:, 0] += shift
    X *= 2.0**log_scale
    settings_ = dict(QUICK[algorithm])
    if algorithm == "subsample-exhaustive":
        settings_["subsample_size"] = {1: 10, 2: 10, 3: 8, 4: 7, 5: 7}[n_components]
    fit = quiet_fit(
        MixtureOfLinearRegressions(n_components, algorithm=algorithm, random_state=0, **settings_),
        X,
        y,
    )
    owner = fit.best_component(X, y)
    lines = np.column_stack([fit.coef_, fit.intercept_])
    # The refit every algorithm shares: one classical AM step from the fitted lines (auto
    # already ends with it, so its lines are their own refit).
    refit = fit
    if algorithm != "auto":
        refit = quiet_fit(
            MixtureOfLinearRegressions(
                n_components, algorithm="am-classic", init=lines, max_iter=1, tol=0.0
            ),
            X,
            y,
        )
    refitted = np.column_stack([refit.coef_, refit.intercept_])
    for line in range(n_components):
        rows = owner == line
        if rows.sum() < n_features + 2:
            continue  # too few rows for a unique line (the fit warns about these)
        reference = LinearRegression().fit(X[rows], y[rows])
        expected = np.append(reference.coef_, reference.intercept_)
        # The refit's lines come back in their own order: match each by its rows' line.
        distance = np.abs(refitted - expected).max(axis=1)
        match = refitted[int(np.argmin(distance))]
        scale_of_line = np.abs(expected).max()
        np.testing.assert_allclose(match, expected, rtol=1e-8, atol=1e-8 * scale_of_line)


# --- 2. wide data ---


def traced_peak(work):
    tracemalloc.start()
    try:
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture(scope="module")
def wide_data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20_000, 1_000))
    y = X[:, 0] - X[:, 1] + rng.standard_normal(20_000)
    return X, y


def test_auto_on_20000_rows_of_1000_features_stays_within_three_times_the_data(wide_data):
    X, y = wide_data
    # A short search (the memory of a fit does not grow with its length): a time budget,
    # one polishing step, a tiny sub-sample. The budget may stop it before the sources that
    # once needed n x p^2; the next test runs the worst of them alone.
    estimator = MixtureOfLinearRegressions(
        3,
        random_state=0,
        n_init=2,
        max_iter=1,
        subsample_size=10,
        n_partitions=1,
        time_budget=2.0,
    )
    _, peak = traced_peak(lambda: quiet_fit(estimator, X, y))
    assert peak < 3 * X.nbytes, f"peak {peak / X.nbytes:.2f} x the data"


def test_lines_of_random_rows_of_wide_data_stay_within_the_data(wide_data):
    # The source that once built an outer product per row (n x p^2: 160 GB here); it runs
    # in every auto fit that has the time.
    X, y = wide_data
    Z = np.column_stack([X, np.ones(len(y))])
    context = FitContext(
        Z=Z,
        y=y,
        n_components=3,
        n_features=X.shape[1],
        params={},
        rng=np.random.default_rng(0),
        deadline=None,
        started=time.monotonic(),
        loss_scale=1.0,
        progress=None,
    )
    with single_threaded_blas():
        lines, peak = traced_peak(lambda: lines_of_random_rows(context, 3))
    assert lines.shape == (3, 1_001) and np.isfinite(lines).all()
    assert peak < X.nbytes, f"peak {peak / X.nbytes:.2f} x the data"


# --- 3. no hangs, no crashes ---


def finishes_within(seconds, work):
    """Run ``work`` in a thread; whether it finished in time (a hang must fail, not block)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except Exception as exc:  # reported by the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), outcome


def test_exhaustive_search_with_one_line_returns_the_least_squares_line():
    X, y = lines_data(200, 2, 1, seed=3)
    done, outcome = finishes_within(
        30,
        lambda: MixtureOfLinearRegressions(1, algorithm="subsample-exhaustive", random_state=0).fit(
            X, y
        ),
    )
    assert done, "the exhaustive search with one line did not return"
    assert "error" not in outcome, outcome.get("error")
    fitted = outcome["value"]
    assert fitted.n_candidates_ == 1
    reference = LinearRegression().fit(X, y)
    np.testing.assert_allclose(fitted.coef_[0], reference.coef_, rtol=1e-8)


@pytest.mark.parametrize("n_components", [1, 3])
def test_a_sub_sample_of_100000_rows_returns_or_is_refused(n_components):
    X, y = lines_data(300, 1, 1, seed=4)
    estimator = MixtureOfLinearRegressions(
        n_components, algorithm="subsample-exhaustive", subsample_size=100_000, random_state=0
    )
    started = time.monotonic()
    done, outcome = finishes_within(60, lambda: quiet_fit(estimator, X, y))
    assert done, "a sub-sample of 100,000 rows hung the fit"
    if n_components == 1:
        assert "error" not in outcome, outcome.get("error")
        assert outcome["value"].n_candidates_ == 1
    else:
        error = outcome.get("error")
        assert isinstance(error, ValueError), error
        assert "subsample_size=100000" in str(error)
        assert time.monotonic() - started < 5


# --- 4. small data and the choice of k ---


@pytest.mark.parametrize("seed", range(4))
def test_fifteen_rows_from_two_lines_choose_two(seed):
    X, y = lines_data(15, 1, 2, seed=100 + seed)
    with pytest.warns(DegenerateFitWarning, match="k=6 skipped"):
        selection = quiet_select(X, y, [1, 2, 3, 4, 5, 6])
    assert [fit.n_components for fit in selection.fits] == [1, 2, 3, 4, 5]
    assert selection.best_n_components == 2


@pytest.mark.parametrize("seed", range(4))
def test_forty_rows_from_three_lines_choose_three(seed):
    X, y = lines_data(40, 1, 3, seed=200 + seed)
    selection = quiet_select(X, y, [1, 2, 3, 4, 5, 6])
    assert selection.best_n_components == 3


def quiet_select(X, y, values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # A fit may leave one of its lines short of rows; the sweep's own warning (a skipped
        # k) is raised by select_n_components itself, after its fits.
        warnings.filterwarnings(
            "ignore", category=DegenerateFitWarning, message=r"k=\d+: \d+ of the"
        )
        return select_n_components(X, y, values, random_state=0)


def test_four_lines_on_six_rows_warn():
    X, y = lines_data(6, 1, 2, seed=5)
    with pytest.warns(DegenerateFitWarning, match="lines own fewer than the 3 training rows"):
        MixtureOfLinearRegressions(4, random_state=0).fit(X, y)


@pytest.mark.parametrize("seed", range(3))
def test_the_likelihood_never_falls_as_k_grows_on_the_same_rows(seed):
    X, y = lines_data(2000, 2, 3, seed=300 + seed, noise=0.5)
    # Each k's likelihood comes from a fit at k (one of its starts splits a line of k - 1's
    # maximum), never a copy of a smaller k's: it does not fall, beyond EM's stopping slack, and
    # the sweep gives no SweepLikelihoodWarning (the "error" filter would raise it).
    selection = quiet_select(X, y, [1, 2, 3, 4, 5])
    likelihoods = [fit.score.log_likelihood for fit in selection.fits]
    assert all(b >= a - LIKELIHOOD_DROP_SLACK for a, b in itertools.pairwise(likelihoods)), (
        likelihoods
    )
    assert len(set(likelihoods)) == len(likelihoods), "a likelihood was carried forward"
    # Each score is at least the maximum EM reaches from the fit's own lines alone.
    for fit in selection.fits:
        own = mixture_score(X, y, fit.estimator.coef_, fit.estimator.intercept_, fit_intercept=True)
        assert fit.score.log_likelihood >= own.log_likelihood - 1e-6 * abs(own.log_likelihood)


# --- 5. flags that mean what they say ---


def test_a_sub_sample_search_cut_by_the_time_budget_has_not_converged():
    X, y = lines_data(2000, 2, 2, seed=6)
    estimator = MixtureOfLinearRegressions(
        2,
        algorithm="subsample",
        subsample_size=20,
        n_partitions=10**6,
        time_budget=0.3,
        random_state=0,
    ).fit(X, y)
    assert estimator.n_candidates_ < 10**6
    assert estimator.converged_ is False
    complete = MixtureOfLinearRegressions(
        2, algorithm="subsample", subsample_size=20, n_partitions=200, random_state=0
    ).fit(X, y)
    assert complete.converged_ is True


def test_em_restarts_keep_the_highest_log_likelihood_not_the_lowest_min_loss():
    class Context:
        def __init__(self):
            self.params = {"n_init": 2, "max_iter": 5, "init": None}
            self.deadline = None

        def report(self, *args, **kwargs):
            pass

    # The first restart has the lower min-loss, the second the higher log-likelihood.
    first = EMResult(theta=np.zeros((2, 2)), loss_history=[1.0, 0.5])
    first.log_likelihood_history = [-3.0, -2.0]
    second = EMResult(theta=np.ones((2, 2)), loss_history=[1.0, 0.6])
    second.log_likelihood_history = [-3.0, -1.0]
    results = iter([first, second])
    chosen = restarts(Context(), lambda start, callback: next(results), lambda ctx: None)
    assert chosen is second


def test_em_converges_when_its_mean_log_likelihood_is_near_zero():
    # Noise of standard deviation ~0.24 puts the mean log-likelihood per row near 0, where a
    # relative change is meaningless; EM must still stop on its tolerance, before max_iter.
    X, y = lines_data(400, 1, 2, seed=7, noise=0.242)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        estimator = MixtureOfLinearRegressions(
            2, algorithm="em", max_iter=500, tol=1e-6, random_state=0
        ).fit(X, y)
    assert estimator.converged_
    assert estimator.n_iter_ < 500
