"""Batched least squares against numpy's lstsq, one problem at a time."""

import numpy as np
import pytest

import mixreg._lstsq
from mixreg._lstsq import (
    lstsq_by_label,
    lstsq_row_sets,
    lstsq_weighted,
    solve_normal_equations,
)


def numpy_lstsq(Z, y):
    solution, *_ = np.linalg.lstsq(Z, y, rcond=None)
    return solution


def weighted_numpy_lstsq(Z, y, weights):
    root = np.sqrt(weights)
    return numpy_lstsq(Z * root[:, None], y * root)


@pytest.fixture
def no_float_errors():
    """Any floating-point warning (division by zero, invalid value) is an error."""
    with np.errstate(all="raise"):
        yield


def test_solve_normal_equations_full_rank(no_float_errors):
    rng = np.random.default_rng(0)
    problems = [(rng.normal(size=(20, 4)), rng.normal(size=20)) for _ in range(5)]
    gram = np.stack([Z.T @ Z for Z, _ in problems])
    rhs = np.stack([Z.T @ y for Z, y in problems])
    theta = solve_normal_equations(gram, rhs)
    assert theta.shape == (5, 4)
    for solution, (Z, y) in zip(theta, problems, strict=True):
        np.testing.assert_allclose(solution, numpy_lstsq(Z, y), rtol=1e-9, atol=1e-12)


def test_solve_normal_equations_with_features_of_very_different_scales(no_float_errors):
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(30, 3)) * np.array([1e-4, 1.0, 1e4])
    y = rng.normal(size=30)
    theta = solve_normal_equations((Z.T @ Z)[None], (Z.T @ y)[None])[0]
    np.testing.assert_allclose(theta, numpy_lstsq(Z, y), rtol=1e-7)


def test_duplicated_column_gives_the_minimum_norm_solution(no_float_errors):
    rng = np.random.default_rng(2)
    x = rng.normal(size=15)
    Z = np.column_stack([x, x, np.ones(15)])
    y = 2.0 * x + 1.0 + 0.1 * rng.normal(size=15)
    theta = solve_normal_equations((Z.T @ Z)[None], (Z.T @ y)[None])[0]
    expected = numpy_lstsq(Z, y)
    assert np.all(np.isfinite(theta))
    # The slope is split evenly between the two copies, as numpy's minimum-norm answer does.
    np.testing.assert_allclose(theta, expected, rtol=1e-7, atol=1e-9)
    assert theta[0] == pytest.approx(theta[1], rel=1e-7)


def test_zero_column_gets_a_zero_coefficient(no_float_errors):
    rng = np.random.default_rng(3)
    Z = np.column_stack([rng.normal(size=10), np.zeros(10), np.ones(10)])
    y = rng.normal(size=10)
    theta = solve_normal_equations((Z.T @ Z)[None], (Z.T @ y)[None])[0]
    np.testing.assert_allclose(theta, numpy_lstsq(Z, y), rtol=1e-9, atol=1e-12)
    assert theta[1] == 0.0


def test_empty_problem_gives_zeros(no_float_errors):
    theta = solve_normal_equations(np.zeros((2, 3, 3)), np.zeros((2, 3)))
    np.testing.assert_array_equal(theta, np.zeros((2, 3)))


def test_fewer_rows_than_parameters_is_finite_and_fits_the_rows(no_float_errors):
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(2, 4))
    y = rng.normal(size=2)
    theta = solve_normal_equations((Z.T @ Z)[None], (Z.T @ y)[None])[0]
    assert np.all(np.isfinite(theta))
    np.testing.assert_allclose(Z @ theta, y, atol=1e-8)


def test_lstsq_row_sets_matches_lstsq_per_set(no_float_errors):
    rng = np.random.default_rng(5)
    Z = np.column_stack([rng.normal(size=(12, 2)), np.ones(12)])
    y = rng.normal(size=12)
    row_sets = rng.integers(0, 12, size=(6, 7))
    row_sets[0, :2] = 5  # a row counted twice
    theta = lstsq_row_sets(Z, y, row_sets)
    assert theta.shape == (6, 3)
    for solution, rows in zip(theta, row_sets, strict=True):
        np.testing.assert_allclose(solution, numpy_lstsq(Z[rows], y[rows]), rtol=1e-8, atol=1e-10)


def test_lstsq_row_sets_of_one_or_two_rows_fit_them(no_float_errors):
    rng = np.random.default_rng(6)
    Z = np.column_stack([rng.normal(size=5), np.ones(5)])
    y = rng.normal(size=5)
    one = lstsq_row_sets(Z, y, np.array([[2]]))[0]
    # One row: a flat line through it (the minimum-norm slope, as LinearRegression gives).
    np.testing.assert_allclose(one, [0.0, y[2]], atol=1e-12)
    two = lstsq_row_sets(Z, y, np.array([[0, 1]]))[0]
    np.testing.assert_allclose(two, np.linalg.solve(Z[:2], y[:2]), rtol=1e-8)


def test_lstsq_by_label_matches_lstsq_per_part(no_float_errors):
    rng = np.random.default_rng(7)
    Z = np.column_stack([rng.normal(size=(40, 3)), np.ones(40)])
    y = rng.normal(size=40)
    labels = rng.integers(0, 3, size=40)
    theta, counts = lstsq_by_label(Z, y, labels, 3)
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=3))
    for component in range(3):
        rows = labels == component
        np.testing.assert_allclose(
            theta[component], numpy_lstsq(Z[rows], y[rows]), rtol=1e-9, atol=1e-12
        )


def test_lstsq_by_label_empty_and_rank_deficient_parts(no_float_errors):
    rng = np.random.default_rng(8)
    x = rng.normal(size=9)
    Z = np.column_stack([x, x, np.ones(9)])  # duplicated column: every part is rank-deficient
    y = 3.0 * x - 1.0
    labels = np.array([0, 0, 0, 0, 0, 2, 2, 2, 2])  # part 1 is empty
    theta, counts = lstsq_by_label(Z, y, labels, 3)
    np.testing.assert_array_equal(counts, [5, 0, 4])
    np.testing.assert_array_equal(theta[1], np.zeros(3))
    for component in (0, 2):
        rows = labels == component
        np.testing.assert_allclose(
            theta[component], numpy_lstsq(Z[rows], y[rows]), rtol=1e-7, atol=1e-9
        )


def test_lstsq_weighted_matches_weighted_lstsq(no_float_errors):
    rng = np.random.default_rng(9)
    Z = np.column_stack([rng.normal(size=(50, 2)), np.ones(50)])
    y = rng.normal(size=50)
    weights = rng.random((3, 50))  # one row of sample weights per component
    weights[2, :25] = 0.0  # half the rows ignored
    theta = lstsq_weighted(Z, y, weights)
    assert theta.shape == (3, 3)
    for component in range(3):
        np.testing.assert_allclose(
            theta[component],
            weighted_numpy_lstsq(Z, y, weights[component]),
            rtol=1e-9,
            atol=1e-12,
        )


def test_lstsq_weighted_with_zero_weights_is_zero(no_float_errors):
    rng = np.random.default_rng(10)
    Z = np.column_stack([rng.normal(size=8), np.ones(8)])
    y = rng.normal(size=8)
    weights = np.stack([np.ones(8), np.zeros(8)])
    theta = lstsq_weighted(Z, y, weights)
    np.testing.assert_allclose(theta[0], numpy_lstsq(Z, y), rtol=1e-9)
    np.testing.assert_array_equal(theta[1], [0.0, 0.0])


def test_gram_accumulation_over_row_blocks(monkeypatch, no_float_errors):
    # Large inputs are accumulated block by block; shrink the block to cross many boundaries.
    monkeypatch.setattr(mixreg._lstsq, "_GRAM_BLOCK_ROWS", 7)
    rng = np.random.default_rng(11)
    Z = np.column_stack([rng.normal(size=(60, 2)), np.ones(60)])
    y = rng.normal(size=60)
    labels = rng.integers(0, 2, size=60)
    theta, _ = lstsq_by_label(Z, y, labels, 2)
    weights = rng.random((2, 60))
    weighted = lstsq_weighted(Z, y, weights)
    for component in range(2):
        rows = labels == component
        np.testing.assert_allclose(theta[component], numpy_lstsq(Z[rows], y[rows]), rtol=1e-9)
        np.testing.assert_allclose(
            weighted[component], weighted_numpy_lstsq(Z, y, weights[component]), rtol=1e-9
        )
