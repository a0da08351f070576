"""Sample weights: an integer weight is that many copies of the row, a zero weight no row."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixreg import (
    DegenerateFitWarning,
    MixtureOfLinearRegressions,
    mixture_score,
    select_n_components,
)
from mixreg._am import classic_am_batch, gradient_am, refit_exactly_until_stable
from mixreg._em import em
from mixreg._loss import score_candidates
from mixreg._moves import split_and_free
from mixreg._ransac import ransac_lines, weighted_median
from mixreg._subsample import random_partition_batches, subsample_search
from mixreg._validation import ALGORITHMS

ALGORITHM_OPTIONS = {"subsample-exhaustive": {"subsample_size": 10}}


def two_lines(seed: int, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    upper = rng.random(n) < 0.5
    y = np.where(upper, X @ [1.5, -1.0] + 2.0, X @ [-1.0, 0.5] - 1.0)
    return X, y + 0.3 * rng.standard_normal(n)


def integer_weights(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed + 1000).integers(1, 4, size=n).astype(np.float64)


def design(X: np.ndarray) -> np.ndarray:
    return np.column_stack([X, np.ones(len(X))])


def assert_same_lines(first: MixtureOfLinearRegressions, second: MixtureOfLinearRegressions):
    np.testing.assert_allclose(first.coef_, second.coef_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(first.intercept_, second.intercept_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(first.shares_, second.shares_, rtol=0, atol=1e-12)
    assert first.train_loss_ == pytest.approx(second.train_loss_, rel=1e-9)


# --- integer weights are repeated rows, from the same start ---


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), algorithm=st.sampled_from(["am", "am-classic", "em"]))
def test_integer_weights_fit_the_lines_of_repeated_rows_from_the_same_start(seed, algorithm):
    X, y = two_lines(seed)
    weights = integer_weights(seed, len(y))
    repeats = weights.astype(int)
    init = np.array([[1.0, -0.5, 1.0], [-0.5, 0.0, -0.5]])
    # Run to convergence: past it, the automatic step of "am" divides rounding by rounding.
    params = {"n_components": 2, "algorithm": algorithm, "init": init, "tol": 1e-10}
    params["max_iter"] = 500
    weighted = MixtureOfLinearRegressions(**params).fit(X, y, sample_weight=weights)
    repeated = MixtureOfLinearRegressions(**params).fit(
        np.repeat(X, repeats, axis=0), np.repeat(y, repeats)
    )
    assert_same_lines(weighted, repeated)
    # A fixed point may be seen one iteration apart (a change of exactly 0 against one
    # of a rounding): the histories agree on the iterations both ran.
    common = min(len(weighted.loss_history_), len(repeated.loss_history_))
    np.testing.assert_allclose(
        weighted.loss_history_[:common], repeated.loss_history_[:common], rtol=1e-9
    )
    if algorithm == "em":
        # Hundreds of EM steps carry the rounding of the weighted sums a little further.
        np.testing.assert_allclose(weighted.weights_, repeated.weights_, rtol=1e-7)
        np.testing.assert_allclose(weighted.noise_variance_, repeated.noise_variance_, rtol=1e-7)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_exact_refit_and_the_batched_polish_weigh_rows_as_copies(seed):
    X, y = two_lines(seed, n=80)
    Z = design(X)
    weights = integer_weights(seed, len(y))
    repeats = weights.astype(int)
    Z_rep, y_rep = np.repeat(Z, repeats, axis=0), np.repeat(y, repeats)
    starts = np.random.default_rng(seed).standard_normal((5, 2, 3))
    weighted = classic_am_batch(Z, y, starts, max_iter=20, tol=0.0, sample_weight=weights)
    repeated = classic_am_batch(Z_rep, y_rep, starts, max_iter=20, tol=0.0)
    np.testing.assert_allclose(weighted.thetas, repeated.thetas, rtol=0, atol=1e-9)
    np.testing.assert_allclose(weighted.losses, repeated.losses, rtol=1e-9)
    np.testing.assert_allclose(
        refit_exactly_until_stable(Z, y, starts[0], sample_weight=weights),
        refit_exactly_until_stable(Z_rep, y_rep, starts[0]),
        rtol=0,
        atol=1e-9,
    )
    np.testing.assert_allclose(
        score_candidates(Z, y, starts, weights), score_candidates(Z_rep, y_rep, starts), rtol=1e-9
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_moves_of_the_default_search_weigh_rows_as_copies(seed):
    X, y = two_lines(seed, n=80)
    Z = design(X)
    weights = integer_weights(seed, len(y))
    repeats = weights.astype(int)
    theta = np.random.default_rng(seed).standard_normal((3, 3))
    np.testing.assert_allclose(
        split_and_free(Z, y, theta, 6, weights),
        split_and_free(np.repeat(Z, repeats, axis=0), np.repeat(y, repeats), theta, 6),
        rtol=0,
        atol=1e-9,
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_subsample_search_from_the_same_drawn_rows_weighs_rows_as_copies(seed):
    # The sub-sample is drawn (in proportion to the weights): from the same drawn rows the
    # candidates, their weighted scores and the weighted refit are those of repeated rows.
    X, y = two_lines(seed, n=80)
    Z = design(X)
    weights = integer_weights(seed, len(y))
    repeats = weights.astype(int)
    drawn = np.random.default_rng(seed).integers(0, len(y), size=20)
    # The same rows, as indices into the repeated data (the first copy of each).
    first_copy = np.concatenate([[0], np.cumsum(repeats)[:-1]])[drawn]
    results = []
    for Z_fit, y_fit, rows, row_weights in (
        (Z, y, drawn, weights),
        (np.repeat(Z, repeats, axis=0), np.repeat(y, repeats), first_copy, None),
    ):
        partitions = random_partition_batches(np.random.default_rng(7), 200, 20, 2)
        results.append(
            subsample_search(
                Z_fit,
                y_fit,
                partitions,
                subsample=rows,
                n_components=2,
                base="ls",
                rng=np.random.default_rng(8),
                min_samples=3,
                sample_weight=row_weights,
            )
        )
    np.testing.assert_allclose(results[0].theta, results[1].theta, rtol=0, atol=1e-9)
    assert results[0].loss == pytest.approx(results[1].loss, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100), min_size=1, max_size=12),
    data=st.data(),
)
def test_the_weighted_median_is_the_median_of_repeated_values(values, data):
    counts = data.draw(st.lists(st.integers(0, 4), min_size=len(values), max_size=len(values)))
    if sum(counts) == 0:
        counts[0] = 1
    repeated = np.repeat(values, counts)
    got = weighted_median(np.array([values]), np.array([counts], dtype=np.float64))
    assert got[0] == pytest.approx(float(np.median(repeated)), abs=1e-12)


def test_weighted_ransac_keeps_zero_weight_rows_out_and_recovers_the_weighted_line():
    # Half the rows lie on another line but weigh nothing: RANSAC's counts, threshold and
    # final fit ignore them, so the line is the one the weighted rows lie on.
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 1))
    Z = design(X)
    y = np.where(np.arange(60) < 30, 2.0 * X[:, 0] + 1.0, -3.0 * X[:, 0] + 4.0)
    weights = np.where(np.arange(60) < 30, 1.0, 0.0)
    theta = ransac_lines(
        Z,
        y,
        np.arange(60)[None, :],
        np.array([60]),
        rng,
        min_samples=2,
        sample_weight=weights,
    )
    np.testing.assert_allclose(theta[0], [2.0, 1.0], atol=1e-9)


def test_gradient_am_with_a_fixed_step_divides_by_the_total_weight():
    X, y = two_lines(5)
    Z = design(X)
    weights = integer_weights(5, len(y))
    repeats = weights.astype(int)
    theta = np.array([[1.0, -0.5, 1.0], [-0.5, 0.0, -0.5]])
    weighted = gradient_am(Z, y, theta, step_size=0.5, max_iter=10, tol=0.0, sample_weight=weights)
    repeated = gradient_am(
        np.repeat(Z, repeats, axis=0),
        np.repeat(y, repeats),
        theta,
        step_size=0.5,
        max_iter=10,
        tol=0.0,
    )
    np.testing.assert_allclose(weighted.theta, repeated.theta, rtol=0, atol=1e-12)


def test_em_weighted_log_likelihood_is_per_unit_of_weight():
    X, y = two_lines(9)
    Z = design(X)
    weights = integer_weights(9, len(y))
    repeats = weights.astype(int)
    theta = np.array([[1.5, -1.0, 2.0], [-1.0, 0.5, -1.0]])
    weighted = em(Z, y, theta, max_iter=5, tol=0.0, sample_weight=weights)
    repeated = em(np.repeat(Z, repeats, axis=0), np.repeat(y, repeats), theta, max_iter=5, tol=0.0)
    assert weighted.log_likelihood_history == pytest.approx(
        repeated.log_likelihood_history, rel=1e-10
    )


def test_min_loss_bic_and_the_k_sweep_count_weights_as_copies():
    X, y = two_lines(11, n=80)
    weights = integer_weights(11, len(y))
    repeats = weights.astype(int)
    X_rep, y_rep = np.repeat(X, repeats, axis=0), np.repeat(y, repeats)
    model = MixtureOfLinearRegressions(2, random_state=0).fit(X, y)
    assert model.min_loss(X, y, sample_weight=weights) == pytest.approx(
        model.min_loss(X_rep, y_rep), rel=1e-12
    )
    weighted = mixture_score(
        X, y, model.coef_, model.intercept_, fit_intercept=True, sample_weight=weights
    )
    repeated = mixture_score(X_rep, y_rep, model.coef_, model.intercept_, fit_intercept=True)
    assert weighted.log_likelihood == pytest.approx(repeated.log_likelihood, rel=1e-9)
    assert weighted.bic == pytest.approx(repeated.bic, rel=1e-9)
    sweep = select_n_components(
        X, y, (1, 2), sample_weight=weights, algorithm="am-classic", random_state=0
    )
    assert sweep.best_n_components == 2
    one_line = sweep.fits[0]
    expected = mixture_score(
        X_rep,
        y_rep,
        one_line.estimator.coef_,
        one_line.estimator.intercept_,
        fit_intercept=True,
    )
    assert one_line.score.bic == pytest.approx(expected.bic, rel=1e-9)


def test_weighted_scaling_statistics_are_those_of_repeated_rows():
    # Every algorithm sees the data through the scaling: a weighted fit with a huge weight on
    # a few rows must still be invariant to shifting the features and the target.
    X, y = two_lines(13)
    weights = integer_weights(13, len(y))
    weights[:5] = 50.0
    base = MixtureOfLinearRegressions(2, algorithm="am-classic", random_state=3).fit(
        X, y, sample_weight=weights
    )
    shifted = MixtureOfLinearRegressions(2, algorithm="am-classic", random_state=3).fit(
        X + 1000.0, y - 500.0, sample_weight=weights
    )
    np.testing.assert_allclose(base.coef_, shifted.coef_, rtol=1e-6, atol=1e-6)


# --- zero weights are dropped rows ---


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_zero_weights_fit_exactly_what_dropping_the_rows_fits(algorithm):
    X, y = two_lines(21, n=90)
    weights = integer_weights(21, len(y))
    weights[::4] = 0.0
    kept = weights > 0
    params = {"n_components": 2, "algorithm": algorithm, "random_state": 4}
    params.update(ALGORITHM_OPTIONS.get(algorithm, {}))
    with_zeros = MixtureOfLinearRegressions(**params).fit(X, y, sample_weight=weights)
    dropped = MixtureOfLinearRegressions(**params).fit(
        X[kept], y[kept], sample_weight=weights[kept]
    )
    np.testing.assert_array_equal(with_zeros.coef_, dropped.coef_)
    np.testing.assert_array_equal(with_zeros.intercept_, dropped.intercept_)
    assert with_zeros.train_loss_ == dropped.train_loss_


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_weights_move_every_algorithm_towards_the_heavy_rows(algorithm):
    # Rows of a third line weigh 50 times the others: with two lines, one of them must go
    # to the heavy line (unweighted, the two light lines win); the weighted min-loss of the
    # weighted fit is below that of the unweighted fit.
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(150, 1))
    which = np.arange(150) % 3
    slopes, intercepts = np.array([2.0, -2.0, 0.0]), np.array([0.0, 0.0, 8.0])
    y = slopes[which] * X[:, 0] + intercepts[which] + 0.05 * rng.standard_normal(150)
    weights = np.where(which == 2, 50.0, 1.0)
    params = {"n_components": 2, "algorithm": algorithm, "random_state": 1}
    params.update(ALGORITHM_OPTIONS.get(algorithm, {}))
    weighted = MixtureOfLinearRegressions(**params).fit(X, y, sample_weight=weights)
    unweighted = MixtureOfLinearRegressions(**params).fit(X, y)
    assert weighted.min_loss(X, y, sample_weight=weights) < unweighted.min_loss(
        X, y, sample_weight=weights
    )
    heavy = np.argmin(np.abs(weighted.intercept_ - 8.0))
    assert weighted.intercept_[heavy] == pytest.approx(8.0, abs=0.5)
    assert weighted.shares_[heavy] == pytest.approx(50 / 52, abs=0.05)


def test_equal_weights_fit_as_no_weights():
    X, y = two_lines(31)
    plain = MixtureOfLinearRegressions(2, random_state=2).fit(X, y)
    weighted = MixtureOfLinearRegressions(2, random_state=2).fit(
        X, y, sample_weight=np.full(len(y), 3.0)
    )
    np.testing.assert_array_equal(plain.coef_, weighted.coef_)


# --- bad weights ---


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (lambda n: -np.ones(n), r"sample_weight\[0\] is -1.0; weights must be >= 0"),
        (lambda n: np.r_[np.ones(n - 1), np.nan], r"sample_weight\[59\] is nan"),
        (lambda n: np.r_[np.inf, np.ones(n - 1)], r"sample_weight\[0\] is inf"),
        (lambda n: np.ones(n - 1), "sample_weight has 59 values but X has 60 rows"),
        (lambda n: np.zeros(n), "sample_weight is zero for every row"),
        (lambda n: np.ones((n, 2)), "sample_weight must be 1-dimensional"),
        (lambda n: ["heavy"] * n, "sample_weight must be an array of numbers"),
    ],
)
def test_bad_weights_are_refused_naming_sample_weight(weights, message):
    X, y = two_lines(1)
    with pytest.raises(ValueError, match=message):
        MixtureOfLinearRegressions(2).fit(X, y, sample_weight=weights(len(y)))


def test_weighted_fit_holds_at_k_1_and_at_the_largest_k():
    X, y = two_lines(41, n=120)
    weights = integer_weights(41, 120)
    repeats = weights.astype(int)
    one = MixtureOfLinearRegressions(1, random_state=0).fit(X, y, sample_weight=weights)
    root = np.sqrt(weights)
    lstsq = np.linalg.lstsq(design(X) * root[:, None], y * root, rcond=None)[0]
    np.testing.assert_allclose(one.coef_[0], lstsq[:-1], atol=1e-9)
    np.testing.assert_allclose(one.intercept_[0], lstsq[-1], atol=1e-9)
    # The largest k the rows allow: every line keeps finite coefficients, the shares sum to 1,
    # and the training min-loss is that of the repeated rows.
    many = MixtureOfLinearRegressions(30, algorithm="am-classic", random_state=0)
    with warnings.catch_warnings():
        # So many lines on so few rows: some own fewer rows than they need, as warned.
        warnings.simplefilter("ignore", DegenerateFitWarning)
        many.fit(X, y, sample_weight=weights)
    assert many.shares_.sum() == pytest.approx(1.0)
    assert np.all(np.isfinite(many.coef_))
    assert many.train_loss_ == pytest.approx(
        many.min_loss(np.repeat(X, repeats, axis=0), np.repeat(y, repeats)), rel=1e-9
    )
