"""Batched least squares against numpy's lstsq, one problem at a time."""

import numpy as np
import pytest

import mixreg._lstsq
from mixreg._lstsq import (
    WeightedLeastSquares,
    lstsq_by_label,
    lstsq_row_sets,
    lstsq_weighted,
)
from mixreg._normal_equations import solve_normal_equations
from mixreg._partition_moments import PartitionSums


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


@pytest.mark.parametrize("weighted", [False, True])
def test_partition_sums_moved_by_a_few_rows_are_the_sums_of_the_new_partitions(weighted):
    rng = np.random.default_rng(3)
    n, k = 400, 3
    Z = np.column_stack([rng.normal(size=(n, 2)), np.ones(n)])
    y = rng.normal(size=n)
    sample_weight = rng.uniform(0.5, 2.0, n) if weighted else None
    products = WeightedLeastSquares(Z, y).products
    labels = rng.integers(0, k, size=(4, n))
    # Part 2 of the last partition owns three rows, which all move to part 0 below.
    labels[3][labels[3] == 2] = 1
    labels[3, :3] = 2
    sums = PartitionSums.of(Z, y, products, labels, k, sample_weight)
    kept = np.array([True, False, True, True])
    new_labels = labels[kept].copy()
    new_labels[0, :5] = (new_labels[0, :5] + 1) % k
    new_labels[1, 10:13] = (new_labels[1, 10:13] + 2) % k
    new_labels[2, :3] = 0
    moved = new_labels != labels[kept]
    updated = sums.moved_to(new_labels, kept, moved)
    fresh = PartitionSums.of(Z, y, products, new_labels, k, sample_weight)
    np.testing.assert_array_equal(updated.counts, fresh.counts)
    assert updated.counts[2, 2] == 0
    np.testing.assert_allclose(updated.sums, fresh.sums, rtol=1e-12, atol=1e-10)
    assert not updated.sums[2, 2].any()
    theta = updated.solve()
    weights = np.ones(n) if sample_weight is None else sample_weight
    for partition in range(3):
        for part in range(k):
            rows = new_labels[partition] == part
            if not rows.any():
                assert not theta[partition, part].any()
                continue
            expected = weighted_numpy_lstsq(Z[rows], y[rows], weights[rows])
            np.testing.assert_allclose(theta[partition, part], expected, rtol=1e-9, atol=1e-12)


def test_partition_sums_are_summed_again_when_many_rows_moved(monkeypatch):
    rng = np.random.default_rng(4)
    n, k = 200, 2
    Z = np.column_stack([rng.normal(size=n), np.ones(n)])
    y = rng.normal(size=n)
    products = WeightedLeastSquares(Z, y).products
    labels = rng.integers(0, k, size=(2, n))
    sums = PartitionSums.of(Z, y, products, labels, k)
    new_labels = 1 - labels
    summed_again = []
    original = PartitionSums.of.__func__

    def counted(cls, *args, **kwargs):
        summed_again.append(True)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(PartitionSums, "of", classmethod(counted))
    updated = sums.moved_to(new_labels, np.ones(2, dtype=bool), new_labels != labels)
    assert summed_again
    np.testing.assert_array_equal(updated.counts, sums.counts[:, ::-1])
