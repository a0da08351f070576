"""EM's weighted least squares for lines of many parameters: every part's centred, weighted
moments in one batched product per block of rows."""

from __future__ import annotations

import numpy as np
import pytest

import mixreg._lstsq
from mixreg._lstsq import lstsq_weighted, weighted_moments


def _weighted_lstsq(Z, y, weights):
    root = np.sqrt(weights)
    solution, *_ = np.linalg.lstsq(Z * root[:, None], y * root, rcond=None)
    return solution


@pytest.mark.parametrize("intercept", [True, False])
def test_many_parameters_match_weighted_least_squares_across_blocks(monkeypatch, intercept):
    # Small blocks, so that the rows cross many block boundaries (and a last partial block).
    monkeypatch.setattr(mixreg._lstsq, "_WEIGHTED_BLOCK_ELEMENTS", 3 * 19 * 7)
    rng = np.random.default_rng(4)
    n, p = 403, 19  # more than 16 parameters: the moments path, not the shared products
    if intercept:
        # Features far from zero: the scatter must be centred per part to keep the slopes.
        Z = rng.standard_normal((n, p)) * 0.01 + 1e4
        Z[:, -1] = 1.0
    else:
        Z = rng.standard_normal((n, p))
    y = Z @ rng.standard_normal(p) + 0.1 * rng.standard_normal(n)
    weights = rng.random((3, n))
    weights[1, : n // 2] = 0.0  # half the rows ignored
    weights[2] = 0.0  # an empty part
    theta = lstsq_weighted(Z, y, weights)
    for part in range(2):
        expected = _weighted_lstsq(Z, y, weights[part])
        np.testing.assert_allclose(theta[part], expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(theta[2], np.zeros(p))


def test_moments_are_the_weighted_mean_and_centred_scatter():
    rng = np.random.default_rng(5)
    n, p = 250, 4
    Z = np.column_stack([rng.standard_normal((n, p - 1)) + 5.0, np.ones(n)])
    y = rng.standard_normal(n)
    weights = rng.random((2, n))
    moments = weighted_moments(Z, y, weights, centre=True)
    augmented = np.column_stack([Z[:, :-1], y])
    for part in range(2):
        w = weights[part]
        mean = w @ augmented / w.sum()
        centred = augmented - mean
        assert moments.weight[part] == pytest.approx(w.sum(), rel=1e-12)
        np.testing.assert_allclose(moments.mean[part], mean, rtol=1e-12)
        np.testing.assert_allclose(
            moments.scatter[part], (centred * w[:, None]).T @ centred, rtol=1e-10
        )
