"""The fast paths of EM, gated EM and their starts give what the plain paths give: the rows'
products formed once read the same sums, a batch of starts ends each start as it would end
alone, and the grouped E-step from per-group sums is the row-by-row likelihood."""

from __future__ import annotations

import numpy as np
import pytest

from mixreg._em import e_step, em, em_batch
from mixreg._gate import GateScaling, _outpaced, gated_em, gated_em_batch
from mixreg._loss import Grouping, grouped_assignment
from mixreg._lstsq import WeightedLeastSquares, lstsq_by_labels, lstsq_weighted
from mixreg._solvers import FitContext, fit_em, random_partition_lines
from mixreg.datasets import make_gated


def _mixture(seed: int, n: int = 240, d: int = 2, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Rows of k random lines in the scaled space (features, then the constant column)."""
    rng = np.random.default_rng(seed)
    Z = np.column_stack([rng.standard_normal((n, d)), np.ones(n)])
    lines = rng.standard_normal((k, d + 1)) * 2.0
    y = np.einsum("ij,ij->i", Z, lines[rng.integers(0, k, size=n)])
    return Z, y + 0.3 * rng.standard_normal(n)


def _context(Z: np.ndarray, y: np.ndarray, seed: int, **extra: object) -> FitContext:
    return FitContext(
        Z=Z,
        y=y,
        n_components=3,
        n_features=Z.shape[1] - 1,
        params={"n_init": 4, "max_iter": 200, "tol": 1e-6, "init": None},
        rng=np.random.default_rng(seed),
        deadline=None,
        started=0.0,
        loss_scale=1.0,
        progress=None,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("n_params", [3, 20])
def test_weighted_least_squares_reads_the_sums_lstsq_weighted_forms(n_params: int) -> None:
    # Up to 16 parameters the products are kept; above, every solve forms its own sums.
    rng = np.random.default_rng(n_params)
    Z = np.column_stack([rng.standard_normal((300, n_params - 1)), np.ones(300)])
    y = rng.standard_normal(300)
    weights = rng.random((6, 300))
    solver = WeightedLeastSquares(Z, y)
    assert (solver.products is None) == (n_params > 16)
    np.testing.assert_array_equal(solver.solve(weights), lstsq_weighted(Z, y, weights))


def test_lstsq_by_labels_reading_the_products_is_bitwise_the_same() -> None:
    Z, y = _mixture(1)
    labels = np.random.default_rng(2).integers(0, 3, size=(5, Z.shape[0]))
    weights = np.random.default_rng(3).uniform(0.5, 2.0, Z.shape[0])
    products = WeightedLeastSquares(Z, y).products
    for sample_weight in (None, weights):
        plain, plain_counts = lstsq_by_labels(Z, y, labels, 3, sample_weight=sample_weight)
        read, counts = lstsq_by_labels(
            Z, y, labels, 3, sample_weight=sample_weight, row_products=products
        )
        np.testing.assert_array_equal(read, plain)
        np.testing.assert_array_equal(counts, plain_counts)


def test_random_partitions_follow_the_stream_of_one_draw_at_a_time() -> None:
    Z, y = _mixture(4)
    together = random_partition_lines(_context(Z, y, seed=5), 4)
    one_by_one_ctx = _context(Z, y, seed=5)
    one_by_one = np.concatenate([random_partition_lines(one_by_one_ctx, 1) for _ in range(4)])
    # The same partitions: one solved centred on its own, the others together.
    np.testing.assert_allclose(together, one_by_one, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", ["rows", "weights", "groups", "weighted groups"])
def test_em_batch_ends_every_start_as_it_would_end_alone(variant: str) -> None:
    Z, y = _mixture(6)
    rng = np.random.default_rng(7)
    sample_weight = (
        rng.integers(1, 4, size=Z.shape[0]).astype(float) if "weight" in variant else None
    )
    grouping = Grouping.of(rng.integers(0, 60, size=Z.shape[0])) if "groups" in variant else None
    starts = random_partition_lines(_context(Z, y, seed=8, grouping=grouping), 4)
    batch = em_batch(
        Z, y, starts, max_iter=300, tol=1e-8, sample_weight=sample_weight, grouping=grouping
    )
    for index, start in enumerate(starts):
        alone = em(
            Z, y, start, max_iter=300, tol=1e-8, sample_weight=sample_weight, grouping=grouping
        )
        assert batch.n_iter[index] == alone.n_iter
        assert batch.converged[index] == alone.converged
        np.testing.assert_allclose(batch.thetas[index], alone.theta, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(batch.variances[index], alone.variances, rtol=1e-8)
        np.testing.assert_allclose(
            batch.log_likelihood_histories[index], alone.log_likelihood_history, rtol=1e-10
        )
        np.testing.assert_allclose(batch.loss_histories[index], alone.loss_history, rtol=1e-10)


def test_fit_em_keeps_the_start_of_highest_likelihood_among_its_starts() -> None:
    Z, y = _mixture(9)
    result = fit_em(_context(Z, y, seed=10))
    starts = random_partition_lines(_context(Z, y, seed=10), 4)
    alone = [em(Z, y, start, max_iter=200, tol=1e-6) for start in starts]
    assert alone[0].log_likelihood_history is not None
    best = int(np.argmax([run.log_likelihood_history[-1] for run in alone]))  # type: ignore[index]
    np.testing.assert_allclose(result.theta, alone[best].theta, rtol=1e-8, atol=1e-10)
    assert result.n_iter == alone[best].n_iter


@pytest.mark.parametrize("weighted", [False, True])
def test_grouped_e_step_is_the_row_by_row_likelihood(weighted: bool) -> None:
    Z, y = _mixture(11)
    rng = np.random.default_rng(12)
    grouping = Grouping.of(rng.integers(0, 40, size=Z.shape[0]))
    sample_weight = rng.uniform(0.5, 3.0, size=Z.shape[0]) if weighted else None
    theta = rng.standard_normal((2, 3, 3))
    weights = rng.dirichlet(np.ones(3), size=2)
    variances = rng.uniform(0.5, 2.0, size=(2, 3))
    expectation = e_step(
        Z, y, theta, weights, variances, sample_weight=sample_weight, grouping=grouping
    )
    residuals = y - np.einsum("skp,np->skn", theta, Z)
    row_weight = np.ones(Z.shape[0]) if sample_weight is None else sample_weight
    log_density = row_weight * (
        -0.5 * np.log(2 * np.pi * variances)[:, :, None]
        - residuals**2 / (2 * variances)[:, :, None]
    )
    by_group = np.zeros((2, 3, grouping.n_groups))
    np.add.at(by_group, (slice(None), slice(None), grouping.codes), log_density)
    log_joint = np.log(weights)[:, :, None] + by_group
    top = log_joint.max(axis=1)
    log_norm = top + np.log(np.exp(log_joint - top[:, None]).sum(axis=1))
    np.testing.assert_allclose(
        expectation.log_likelihood, log_norm.sum(axis=1) / row_weight.sum(), rtol=1e-12
    )
    np.testing.assert_allclose(
        expectation.unit_posteriors, np.exp(log_joint - log_norm[:, None]), rtol=1e-9, atol=1e-300
    )
    squared, _ = grouped_assignment(residuals**2, sample_weight, grouping)
    np.testing.assert_allclose(
        expectation.min_loss, (squared * row_weight).sum(axis=1) / row_weight.sum(), rtol=1e-12
    )


def test_gated_em_batch_ends_every_start_as_it_would_end_alone() -> None:
    data = make_gated(
        n_samples=400, n_features=2, n_components=3, n_concomitant=2, noise=0.3, random_state=3
    )
    Z = np.column_stack([(data.X - data.X.mean(0)) / data.X.std(0), np.ones(len(data.y))])
    y = (data.y - data.y.mean()) / data.y.std()
    _, W = GateScaling.of(data.concomitant)
    starts = random_partition_lines(_context(Z, y, seed=13), 3)
    floor = 1e-8 * float(np.var(y))
    batch = gated_em_batch(Z, y, W, starts, max_iter=500, tol=1e-9, variance_floor=floor)
    for start, together in zip(starts, batch, strict=True):
        alone = gated_em(Z, y, W, start, max_iter=500, tol=1e-9, variance_floor=floor)
        assert together.n_iter == alone.n_iter
        assert together.converged == alone.converged
        np.testing.assert_allclose(together.theta, alone.theta, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(together.beta, alone.beta, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(
            together.log_likelihood_history, alone.log_likelihood_history, rtol=1e-10
        )


def test_a_start_that_cannot_catch_up_with_a_converged_one_stops() -> None:
    converged = np.array([True, False, False, False])
    histories = [
        [1.0, 1.7, 1.7],  # converged at 1.7
        [1.0, 1.49, 1.49 + 1e-6],  # far behind, crawling: 100 iterations add 1e-4
        [1.0, 1.2, 1.5],  # far behind but climbing fast
        [1.0, 1.69, 1.699999],  # close behind
    ]
    active = np.array([1, 2, 3])
    np.testing.assert_array_equal(
        _outpaced(histories, active, converged, iterations_left=100), [True, False, False]
    )
    # Without a converged start nothing is compared.
    none = np.zeros(4, dtype=bool)
    assert not _outpaced(histories, active, none, iterations_left=100).any()
    # With many iterations left, even the crawl could close the gap.
    assert not _outpaced(histories, active, converged, iterations_left=10**6).any()
