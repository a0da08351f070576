"""Warm starts: lines fitted yesterday start today's fit on new rows of the same mixture."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions

LINES = np.array([[1.0, 2.0, -1.0], [-2.0, 0.5, 1.5], [0.5, -1.5, 2.0]])
INTERCEPTS = np.array([1.0, -1.0, 0.0])


def mixture(seed: int, n_rows: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Rows of three noisy lines in three features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, 3))
    labels = rng.integers(0, 3, size=n_rows)
    y = np.einsum("ij,ij->i", X, LINES[labels]) + INTERCEPTS[labels]
    return X, y + 0.3 * rng.standard_normal(n_rows)


@pytest.fixture(scope="module")
def yesterday() -> np.ndarray:
    """Lines fitted on yesterday's rows: coefficients then intercept, one row per line."""
    fitted = MixtureOfLinearRegressions(3, random_state=0).fit(*mixture(1))
    return np.column_stack([fitted.coef_, fitted.intercept_])


@pytest.mark.parametrize("algorithm", ["am", "am-classic", "em"])
def test_a_warm_start_converges_in_fewer_iterations_than_a_cold_one(algorithm, yesterday):
    X, y = mixture(2)
    cold = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=0).fit(X, y)
    warm = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=0, init=yesterday)
    warm.fit(X, y)
    assert warm.converged_ and cold.converged_
    assert warm.n_iter_ < cold.n_iter_
    assert warm.train_loss_ <= cold.train_loss_ * 1.001


def test_auto_polishes_the_warm_start_first_beside_its_own_candidates(yesterday):
    X, y = mixture(2)
    cold = MixtureOfLinearRegressions(3, random_state=0).fit(X, y)
    warm = MixtureOfLinearRegressions(3, random_state=0, init=yesterday).fit(X, y)
    sources = [candidate["source"] for candidate in warm.candidates_]
    # The start is polished first; a finalist polished again on all rows is recorded again.
    assert sources[0] == "init"
    # Its own candidates are the cold search's, up to the finalists' second polish.
    own = sources[1:]
    cut = own.index("init") if "init" in own else len(own)
    assert [c["source"] for c in cold.candidates_][:cut] == own[:cut]
    started = warm.candidates_[0]
    assert started["converged"] and started["n_iter"] < warm.candidates_[1]["n_iter"]
    assert warm.train_loss_ <= cold.train_loss_ + 1e-12


def test_auto_keeps_drawing_its_own_random_starts_when_given_lines(yesterday):
    X, y = mixture(2)
    warm = MixtureOfLinearRegressions(3, random_state=0, init=yesterday).fit(X, y)
    before = np.array([c["min_loss_before"] for c in warm.candidates_[1:]])
    # Had the random sources returned the given lines, they would all start at its loss.
    assert len(np.unique(np.round(before, 12))) > 3


def test_lines_of_the_wrong_shape_are_refused(yesterday):
    X, y = mixture(2)
    with pytest.raises(ValueError, match="init"):
        MixtureOfLinearRegressions(2, init=yesterday).fit(X, y)


def test_auto_takes_lines_with_any_number_of_random_starts(yesterday):
    X, y = mixture(2)
    warm = MixtureOfLinearRegressions(3, n_init=8, random_state=0, init=yesterday).fit(X, y)
    assert warm.candidates_[0]["source"] == "init"
    with pytest.raises(ValueError, match="n_init must be 1"):
        MixtureOfLinearRegressions(3, algorithm="am", n_init=8, init=yesterday).fit(X, y)
