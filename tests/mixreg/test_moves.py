"""The moves of the default search: each repairs the kind of local minimum it is made for."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg._am import classic_am_batch
from mixreg._moves import Fit, reseed_by_residual, split_and_free
from mixreg.datasets import make_realizable


def design(X):
    return np.column_stack([X, np.ones(len(X))])


def brute_min_loss(Z, y, theta):
    """The min-loss by its definition: a loop over rows and lines."""
    return float(
        np.mean([min((t - z @ line) ** 2 for line in theta) for z, t in zip(Z, y, strict=True)])
    )


def realizable(n_components, seed, n_samples=600):
    X, y, coef, intercept, labels = make_realizable(
        n_samples, 2, n_components, noise=0.05, random_state=seed
    )
    return design(X), y, np.column_stack([coef, intercept]), labels


def test_fit_sums_match_their_definitions():
    Z, y, truth, _ = realizable(3, 1, n_samples=50)
    theta = truth + 0.3
    fit = Fit.of(Z, y, theta)
    squared = (y[:, None] - Z @ theta.T) ** 2
    ordered = np.sort(squared, axis=1)
    np.testing.assert_allclose(fit.best, ordered[:, 0])
    np.testing.assert_allclose(fit.unit_second, ordered[:, 1])
    assert fit.best.mean() == brute_min_loss(Z, y, theta) or np.isclose(
        fit.best.mean(), brute_min_loss(Z, y, theta)
    )
    for line in range(3):
        rows = np.argmin(squared, axis=1) == line
        assert np.isclose(fit.line_losses()[line], squared[rows, line].sum())
        assert np.isclose(fit.drop_costs()[line], (ordered[rows, 1] - ordered[rows, 0]).sum())


def test_split_and_free_repairs_a_line_on_two_and_a_line_on_none():
    Z, y, truth, labels = realizable(4, 3)
    # A fixed point of classical AM: one line so far away that it wins no row, while one
    # line is the least-squares line of the rows of true lines 2 and 3 together.
    union = np.isin(labels, (2, 3))
    between, *_ = np.linalg.lstsq(Z[union], y[union], rcond=None)
    stuck = np.stack([truth[0], [0.0, 0.0, 1e3], truth[1], between])
    polished = classic_am_batch(Z, y, stuck[None], max_iter=100, tol=0.0)
    stuck_loss = float(polished.losses[0])
    assert stuck_loss > 10 * 0.05**2, "the premise: classical AM alone stays stuck"
    starts = split_and_free(Z, y, polished.thetas[0], count=4)
    assert starts.shape == (4, 4, 3)
    repaired = classic_am_batch(Z, y, starts, max_iter=100, tol=0.0)
    assert repaired.losses.min() < 1.5 * 0.05**2
    # The most promising start comes first.
    assert repaired.losses[0] == pytest.approx(repaired.losses.min(), rel=1e-12)


def test_reseed_by_residual_puts_a_line_where_no_line_reaches():
    Z, y, truth, _ = realizable(3, 9)
    # Two lines on true line 0 and one on true line 1: no line reaches true line 2's rows.
    stuck = np.stack([truth[0], truth[0] + 0.01, truth[1]])
    stuck_loss = brute_min_loss(Z, y, stuck)
    starts = reseed_by_residual(Z, y, stuck, count=6, rng=np.random.default_rng(0))
    assert starts.shape == (6, 3, 3)
    # Every start keeps all lines but one.
    assert ((starts != stuck).any(axis=2).sum(axis=1) == 1).all()
    polished = classic_am_batch(Z, y, starts, max_iter=100, tol=0.0)
    assert polished.losses.min() < 1.5 * 0.05**2 < 0.01 * stuck_loss


def test_reseeding_draws_rows_by_their_residual_under_the_seed():
    Z, y, truth, _ = realizable(3, 9)
    stuck = np.stack([truth[0], truth[0] + 0.01, truth[1]])
    first, again, other = (
        reseed_by_residual(Z, y, stuck, 5, np.random.default_rng(seed)) for seed in (1, 1, 2)
    )
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
