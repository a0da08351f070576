"""Choosing k by BIC (select_n_components, mixture_score)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mixreg import (
    MixtureOfLinearRegressions,
    check_n_components_list,
    mixture_score,
    select_n_components,
)
from mixreg._loss import predict_lines, row_min_losses
from mixreg._selection import one_more_line
from mixreg.datasets import make_realizable


def bic_by_hand(X, y, coef, intercept):
    """The mixture's BIC written out row by row."""
    n, k = len(y), len(intercept)
    predictions = [[x @ c + b for c, b in zip(coef, intercept, strict=True)] for x in X]
    best = [
        min(range(k), key=lambda j, row=row, t=t: (t - row[j]) ** 2)
        for row, t in zip(predictions, y, strict=True)
    ]
    shares = [best.count(j) / n for j in range(k)]
    variances = []
    for j in range(k):
        won = [(t - row[j]) ** 2 for row, t, b in zip(predictions, y, best, strict=True) if b == j]
        variances.append(max(sum(won) / max(len(won), 1), 1e-8 * float(np.var(y))))
    log_likelihood = 0.0
    for row, t in zip(predictions, y, strict=True):
        density = sum(
            shares[j]
            / math.sqrt(2 * math.pi * variances[j])
            * math.exp(-((t - row[j]) ** 2) / (2 * variances[j]))
            for j in range(k)
            if shares[j] > 0
        )
        log_likelihood += math.log(density)
    n_parameters = k * (X.shape[1] + 1) + k + (k - 1)
    return log_likelihood, n_parameters, -2 * log_likelihood + n_parameters * math.log(n)


def test_mixture_score_matches_the_formula_written_out():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((25, 2))
    y = rng.standard_normal(25)
    coef = np.array([[1.0, -0.5], [0.2, 0.3], [50.0, 50.0]])  # the third line wins no row
    intercept = np.array([0.1, -0.2, 100.0])
    score = mixture_score(X, y, coef, intercept, fit_intercept=True)
    log_likelihood, n_parameters, bic = bic_by_hand(X, y, coef, intercept)
    assert score.log_likelihood == pytest.approx(log_likelihood, rel=1e-10)
    assert score.n_parameters == n_parameters == 3 * 3 + 3 + 2
    assert score.bic == pytest.approx(bic, rel=1e-10)
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
    assert "given lines" not in {c["source"] for c in two.candidates_}
    given = [c for c in three.candidates_ if c["source"] == "given lines"]
    assert len(given) == 1
    start = one_more_line(X, y, two)
    start_loss = float(row_min_losses(y, predict_lines(X, start[:, :-1], start[:, -1])).mean())
    assert given[0]["min_loss_before"] == pytest.approx(start_loss, rel=1e-9)
    assert start_loss < two.train_loss_
    assert three.train_loss_ <= given[0]["min_loss_after"] * (1 + 1e-9)
