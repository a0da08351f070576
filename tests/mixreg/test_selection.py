"""Choosing k by BIC (select_n_components, mixture_score)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions, mixture_score, select_n_components
from mixreg._loss import predict_lines, row_min_losses
from mixreg._selection import one_more_line
from mixreg.datasets import make_realizable
from mixreg.service_support import check_n_components_list, sweep_warm_start


def hard_reading(X, y, coef, intercept, floor):
    """Weights and variances of lines read from the rows each predicts best."""
    residuals = y[:, None] - X @ coef.T - intercept
    best = np.argmin(residuals**2, axis=1)
    k = len(intercept)
    counts = np.bincount(best, minlength=k)
    won = np.bincount(best, weights=residuals[np.arange(len(y)), best] ** 2, minlength=k)
    variances = np.maximum(np.where(counts > 0, won / np.maximum(counts, 1), floor), floor)
    weights = np.maximum(counts / len(y), 1e-12)
    return weights / weights.sum(), variances


def log_likelihood_of(X, y, coef, intercept, weights, variances):
    total = 0.0
    for x, t in zip(X, y, strict=True):
        density = sum(
            w / math.sqrt(2 * math.pi * v) * math.exp(-((t - x @ c - b) ** 2) / (2 * v))
            for c, b, w, v in zip(coef, intercept, weights, variances, strict=True)
        )
        total += math.log(density)
    return total


def em_by_hand(X, y, coef, intercept, iterations=500):
    """EM for the mixture from the lines' hard reading, variances floored at 1% of one
    least-squares line's residual variance; returns the final total log-likelihood, the floor
    and the final weights and variances."""
    design = np.column_stack([X, np.ones(len(y))])
    one_line = np.linalg.lstsq(design, y, rcond=None)[0]
    floor = 0.01 * np.mean((y - design @ one_line) ** 2)
    lines = np.column_stack([coef, intercept])
    weights, variances = hard_reading(X, y, coef, intercept, floor)
    for _ in range(iterations):
        log_density = (
            np.log(weights)
            - 0.5 * np.log(2 * np.pi * variances)
            - (y[:, None] - design @ lines.T) ** 2 / (2 * variances)
        )
        responsibilities = np.exp(log_density - log_density.max(axis=1, keepdims=True))
        responsibilities /= responsibilities.sum(axis=1, keepdims=True)
        for j in range(len(lines)):
            root = np.sqrt(responsibilities[:, j])
            if responsibilities[:, j].sum() > 1e-9:
                lines[j] = np.linalg.lstsq(design * root[:, None], y * root, rcond=None)[0]
        mass = responsibilities.sum(axis=0)
        squared = (y[:, None] - design @ lines.T) ** 2
        variances = np.maximum((responsibilities * squared).sum(axis=0) / mass, floor)
        weights = np.maximum(mass / len(y), 1e-12)
        weights /= weights.sum()
    total = log_likelihood_of(X, y, lines[:, :-1], lines[:, -1], weights, variances)
    return total, floor, weights, variances


def random_partition_lines_by_hand(X, y, k, count, seed):
    """The least-squares lines of ``count`` random partitions of the rows, drawn as
    mixture_score draws them (all rows, one label per row and partition)."""
    labels = np.random.default_rng(seed).integers(0, k, size=(count, len(y)))
    design = np.column_stack([X, np.ones(len(y))])
    starts = []
    for partition in labels:
        # Every part has more rows than parameters here: each line is determined.
        assert np.bincount(partition, minlength=k).min() > X.shape[1] + 1
        lines = np.array(
            [
                np.linalg.lstsq(design[partition == j], y[partition == j], rcond=None)[0]
                for j in range(k)
            ]
        )
        starts.append(lines)
    return starts


def test_mixture_score_is_the_highest_maximum_em_reaches_from_the_lines_and_random_partitions():
    rng = np.random.default_rng(0)
    n = 60
    X = rng.standard_normal((n, 2))
    y = rng.standard_normal(n)
    coef = np.array([[1.0, -0.5], [0.2, 0.3], [50.0, 50.0]])  # the third line wins no row
    intercept = np.array([0.1, -0.2, 100.0])
    score = mixture_score(X, y, coef, intercept, fit_intercept=True, random_state=0)
    from_lines, floor, *_ = em_by_hand(X, y, coef, intercept)
    start = log_likelihood_of(X, y, coef, intercept, *hard_reading(X, y, coef, intercept, floor))
    assert from_lines > start + 1.0, "EM did not climb from the lines' reading"
    # The brute-force twin: EM from the lines and from each random partition (a maximum where
    # a line owns fewer than its 3 coefficients plus 3 rows is spurious; the floor bounds the rest).
    reached = [from_lines]
    for lines in random_partition_lines_by_hand(X, y, 3, 10, seed=0):
        total, _, weights, _ = em_by_hand(X, y, lines[:, :-1], lines[:, -1])
        if np.all(weights * n >= 6):
            reached.append(total)
    assert max(reached) > from_lines + 1.0, "the random partitions should find a higher maximum"
    assert score.log_likelihood == pytest.approx(max(reached), abs=1e-3)
    assert score.start == "em restart"
    n_parameters = 3 * 3 + 3 + 2
    assert score.n_parameters == n_parameters
    assert score.bic == pytest.approx(
        -2 * score.log_likelihood + n_parameters * math.log(n), rel=1e-12
    )
    without_intercept = mixture_score(X, y, coef, intercept, fit_intercept=False)
    assert without_intercept.n_parameters == n_parameters - 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_sweep_prefers_three_lines_on_data_drawn_from_three(seed):
    X, y, *_ = make_realizable(600, 2, 3, noise=0.3, random_state=seed)
    selection = select_n_components(X, y, [1, 2, 3, 4, 5], random_state=0)
    assert selection.best_n_components == 3
    assert [fit.n_components for fit in selection.fits] == [1, 2, 3, 4, 5]
    losses = [fit.train_min_loss for fit in selection.fits]
    assert all(later <= earlier for earlier, later in itertools.pairwise(losses))
    assert selection.best_estimator.n_components == 3
    for fit in selection.fits:
        assert fit.estimator.coef_.shape == (fit.n_components, 2)
        assert fit.train_min_loss == pytest.approx(fit.estimator.train_loss_)


def test_the_sweep_fits_every_k_like_the_estimator_alone_and_reports_progress():
    X, y, *_ = make_realizable(300, 2, 2, noise=0.3, random_state=3)
    calls = []
    selection = select_n_components(
        X,
        y,
        [3, 1, 2],
        algorithm="am-classic",
        n_init=3,
        random_state=5,
        progress=lambda fraction, info: calls.append((fraction, info["n_components"])),
    )
    assert [fit.n_components for fit in selection.fits] == [1, 2, 3]
    alone = MixtureOfLinearRegressions(2, algorithm="am-classic", n_init=3, random_state=5).fit(
        X, y
    )
    np.testing.assert_array_equal(selection.fits[1].estimator.coef_, alone.coef_)
    fractions = [fraction for fraction, _ in calls]
    assert all(b >= a for a, b in itertools.pairwise(fractions))
    assert fractions[-1] == 1.0
    assert [k for _, k in calls] == sorted(k for _, k in calls)


@pytest.mark.parametrize(
    ("n_components", "message"),
    [
        ([], "n_components is an empty list"),
        ([2, 3, 2], "n_components lists k=2 twice"),
        ([1, 0], r"n_components\[1\] must be an integer >= 1; got 0"),
        ([1, 2.5], r"n_components\[1\] must be an integer >= 1; got 2.5"),
        ([True], r"n_components\[0\] must be an integer >= 1; got True"),
        ([2, 50], r"n_components\[1\]=50 exceeds the 40 training rows"),
        ("123", "n_components must be a list of integers"),
    ],
)
def test_bad_sweeps_are_refused_with_what_is_wrong(n_components, message):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40, 2)), rng.standard_normal(40)
    with pytest.raises(ValueError, match=message):
        select_n_components(X, y, n_components)


def test_the_checked_list_is_sorted():
    assert check_n_components_list((4, 1, 2)) == [1, 2, 4]


def test_one_more_line_fits_the_rows_the_lines_fit_worst():
    X, y, _, _, labels = make_realizable(600, 2, 3, noise=0.05, random_state=2)
    # Two lines fitted to the rows of two of the three true lines.
    first_two = labels < 2
    two = MixtureOfLinearRegressions(2, random_state=0, n_init=4).fit(X[first_two], y[first_two])
    grown = one_more_line(X, y, two)
    assert grown.shape == (3, 3)
    np.testing.assert_array_equal(grown[:2], np.column_stack([two.coef_, two.intercept_]))
    # The rows the two lines fit worst are those of the third true line: the new line goes
    # there, and the three lines fit all rows about as well as the two fit their own.
    grown_loss = float(row_min_losses(y, predict_lines(X, grown[:, :-1], grown[:, -1])).mean())
    assert grown_loss < 0.01 * two.min_loss(X, y)
    assert grown_loss < 2 * two.train_loss_


def test_each_k_of_an_auto_sweep_also_starts_from_the_previous_fit_plus_one_line():
    X, y, *_ = make_realizable(400, 2, 3, noise=0.1, random_state=4)
    selection = select_n_components(X, y, [2, 3], random_state=0, n_init=4)
    two, three = (fit.estimator for fit in selection.fits)
    assert "init" not in {c["source"] for c in two.candidates_}
    # The start is polished first (and again if it is one of the finalists).
    given = [c for c in three.candidates_ if c["source"] == "init"]
    assert given and given[0] is three.candidates_[0]
    start = one_more_line(X, y, two)
    start_loss = float(row_min_losses(y, predict_lines(X, start[:, :-1], start[:, -1])).mean())
    assert given[0]["min_loss_before"] == pytest.approx(start_loss, rel=1e-9)
    assert start_loss < two.train_loss_
    assert three.train_loss_ <= given[0]["min_loss_after"] * (1 + 1e-9)


def test_a_sweep_warm_starts_only_auto_from_a_fit_with_one_line_less():
    X, y, *_ = make_realizable(300, 2, 3, noise=0.1, random_state=4)
    two = MixtureOfLinearRegressions(2, random_state=0, n_init=4).fit(X, y)
    np.testing.assert_array_equal(
        sweep_warm_start(X, y, 3, two, {"random_state": 0}), one_more_line(X, y, two)
    )
    given = np.zeros((3, 3))
    assert sweep_warm_start(X, y, 3, None, {}) is None, "the first k of a sweep"
    assert sweep_warm_start(X, y, 4, two, {}) is None, "k - 1 is not in the sweep"
    assert sweep_warm_start(X, y, 3, two, {"algorithm": "em"}) is None
    assert sweep_warm_start(X, y, 3, two, {"init": given}) is None


def test_a_grouped_sweep_scores_the_grouped_mixture_and_finds_the_groups_lines():
    # Each user's rows come from one of 3 crossing lines, too noisy for single rows to tell
    # apart; whole users tell all 3.
    rng = np.random.default_rng(0)
    slopes, intercepts = np.array([3.0, -3.0, 0.0]), np.array([0.0, 4.0, -4.0])
    segment = rng.permutation(np.arange(60) % 3)
    users = np.repeat(np.arange(60), rng.integers(5, 51, size=60))
    X = rng.uniform(-1.0, 1.0, size=(users.size, 1))
    line = segment[users]
    y = slopes[line] * X[:, 0] + intercepts[line] + 4.0 * rng.standard_normal(users.size)
    labels = np.array([f"user-{user}" for user in users])
    grouped = select_n_components(X, y, (1, 2, 3, 4), groups=labels, random_state=0)
    assert grouped.best_n_components == 3
    assert select_n_components(X, y, (1, 2, 3, 4), random_state=0).best_n_components < 3
    three = grouped.fits[2]
    assert three.estimator.group_labels_.size == 60
    # The grouped mixture's likelihood: that of the fit's own maximum-likelihood mixture.
    assert three.score.log_likelihood == pytest.approx(three.estimator.log_likelihood_, rel=1e-8)
    lines = (three.estimator.coef_, three.estimator.intercept_)
    scored = mixture_score(X, y, *lines, fit_intercept=True, groups=labels)
    assert scored.log_likelihood == pytest.approx(three.score.log_likelihood, rel=1e-12)
    assert scored.log_likelihood > mixture_score(X, y, *lines, fit_intercept=True).log_likelihood
