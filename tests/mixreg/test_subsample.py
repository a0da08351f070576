"""The sub-sample algorithms: partition enumeration, and Algorithm 2 against a brute-force twin."""

import itertools
import math

import numpy as np
import pytest

from mixreg import MAX_EXHAUSTIVE_PARTITIONS, MixtureOfLinearRegressions, min_loss
from mixreg._loss import score_candidates
from mixreg._subsample import (
    all_partitions,
    exhaustive_partition_batches,
    fit_candidates,
    largest_enumerable_size,
    parts_from_labels,
    random_partitions,
    refit,
    stirling2,
    subsample_search,
)
from mixreg.datasets import make_realizable


def brute_force_partitions(size, n_components):
    """Every partition of range(size) into n_components non-empty parts, as a set."""
    partitions = set()
    for labels in itertools.product(range(n_components), repeat=size):
        if len(set(labels)) != n_components:
            continue
        parts = frozenset(
            frozenset(i for i in range(size) if labels[i] == part) for part in range(n_components)
        )
        partitions.add(parts)
    return partitions


def count_canonical_labelings(size, n_components):
    """Label vectors in first-occurrence order (0 first, each new label one above the last)."""
    count = 0
    for labels in itertools.product(range(n_components), repeat=size):
        highest = -1
        canonical = True
        for label in labels:
            if label > highest + 1:
                canonical = False
                break
            highest = max(highest, label)
        if canonical and highest == n_components - 1:
            count += 1
    return count


def as_partition(labels):
    return frozenset(
        frozenset(np.flatnonzero(labels == part).tolist()) for part in np.unique(labels)
    )


def explicit_stirling2(n, k):
    """S(n, k) = (1/k!) sum_i (-1)^i C(k, i) (k - i)^n."""
    total = sum((-1) ** i * math.comb(k, i) * (k - i) ** n for i in range(k + 1))
    return total // math.factorial(k)


@pytest.mark.parametrize(
    ("size", "n_components"),
    [(size, k) for size in range(1, 7) for k in range(1, size + 1)] + [(7, 2), (7, 3), (7, 4)],
)
def test_stirling2_counts_the_partitions(size, n_components):
    expected = count_canonical_labelings(size, n_components)
    assert stirling2(size, n_components) == expected
    assert len(brute_force_partitions(size, n_components)) == expected


def test_stirling2_is_zero_for_more_parts_than_items():
    assert stirling2(3, 4) == 0
    assert stirling2(5, 0) == 0
    assert stirling2(0, 0) == 1


def test_stirling2_large_values_match_the_explicit_formula():
    for n, k in [(20, 2), (30, 3), (25, 4), (150, 2)]:
        assert stirling2(n, k) == explicit_stirling2(n, k)
    assert stirling2(150, 2) == 2**149 - 1


@pytest.mark.parametrize(("size", "n_components"), [(6, 3), (7, 2), (5, 1), (5, 5), (6, 4)])
def test_all_partitions_is_exactly_the_set_partitions(size, n_components):
    labels = all_partitions(size, n_components)
    assert labels.shape == (stirling2(size, n_components), size)
    assert labels.min() >= 0 and labels.max() < n_components
    partitions = [as_partition(row) for row in labels]
    assert all(len(partition) == n_components for partition in partitions)
    assert len(set(partitions)) == len(partitions), "a partition is listed twice"
    assert set(partitions) == brute_force_partitions(size, n_components)


def test_exhaustive_batches_cover_every_partition_once():
    batches = list(exhaustive_partition_batches(9, 2))
    assert len(batches) > 1
    stacked = np.concatenate(batches)
    np.testing.assert_array_equal(stacked, all_partitions(9, 2))


def test_random_partitions_label_every_item():
    rng = np.random.default_rng(0)
    labels = random_partitions(rng, 500, 7, 3)
    assert labels.shape == (500, 7)
    assert set(np.unique(labels)) == {0, 1, 2}


def test_parts_from_labels_lists_the_rows_of_every_part():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=(20, 8))
    labels[0] = 0  # a partition with two empty parts
    parts, sizes = parts_from_labels(labels, 3)
    assert parts.shape[0] == sizes.shape[0] == 60
    for partition in range(20):
        for component in range(3):
            flat = partition * 3 + component
            expected = np.flatnonzero(labels[partition] == component)
            assert sizes[flat] == expected.size
            np.testing.assert_array_equal(np.sort(parts[flat, : sizes[flat]]), expected)
    np.testing.assert_array_equal(sizes[:3], [8, 0, 0])


def test_largest_enumerable_size_is_the_largest_under_the_cap():
    for n_components in (2, 3, 4):
        size = largest_enumerable_size(n_components, MAX_EXHAUSTIVE_PARTITIONS, limit=150)
        assert stirling2(size, n_components) <= MAX_EXHAUSTIVE_PARTITIONS
        assert stirling2(size + 1, n_components) > MAX_EXHAUSTIVE_PARTITIONS


def test_largest_enumerable_size_needs_no_pass_per_row_at_the_largest_limits():
    # The service accepts 10^7 training rows: one part takes them all, and two or more parts
    # stop counting long before the limit (a row-by-row recount once took minutes at 10^5).
    assert largest_enumerable_size(1, MAX_EXHAUSTIVE_PARTITIONS, limit=10**7) == 10**7
    for n_components in (2, 3, 10):
        size = largest_enumerable_size(n_components, MAX_EXHAUSTIVE_PARTITIONS, limit=10**7)
        assert size == largest_enumerable_size(n_components, MAX_EXHAUSTIVE_PARTITIONS, 150)


def design(X, fit_intercept):
    return np.column_stack([X, np.ones(len(X))]) if fit_intercept else X


def loop_min_loss(Z, y, lines):
    return min_loss(y, np.array([[z @ line for line in lines] for z in Z]))


def twin_algorithm_2(X, y, subsample, n_components, fit_intercept):
    """Algorithm 2 as the paper writes it, with numpy's lstsq per part, in the caller's units.

    Returns the candidate losses, and the lines and min-loss after the refit.
    """
    Z = design(X, fit_intercept)
    Z_sub, y_sub = Z[subsample], y[subsample]
    best_loss, best_lines, candidate_losses = np.inf, None, []
    for partition in brute_force_partitions(len(subsample), n_components):
        lines = []
        for part in partition:
            rows = sorted(part)
            solution, *_ = np.linalg.lstsq(Z_sub[rows], y_sub[rows], rcond=None)
            lines.append(solution)
        loss = loop_min_loss(Z, y, lines)
        candidate_losses.append(loss)
        if loss < best_loss:
            best_loss, best_lines = loss, lines
    # Refit each line on the rows it predicts best (ties to the first line).
    winners = [
        int(np.argmin([abs(y_i - z @ line) for line in best_lines]))
        for z, y_i in zip(Z, y, strict=True)
    ]
    refitted = []
    for component, line in enumerate(best_lines):
        rows = [i for i, winner in enumerate(winners) if winner == component]
        if rows:
            line, *_ = np.linalg.lstsq(Z[rows], y[rows], rcond=None)
        refitted.append(line)
    return candidate_losses, np.array(refitted), loop_min_loss(Z, y, refitted)


def match_lines(lines, reference):
    """Reorder ``lines`` to be closest to ``reference`` (brute force over permutations)."""
    best = min(
        itertools.permutations(range(len(lines))),
        key=lambda order: np.abs(lines[list(order)] - reference).sum(),
    )
    return lines[list(best)]


def seed_with_distinct_subsample(n_samples, subsample_size, first_seed):
    """First seed from ``first_seed`` on whose sub-sample A (as the estimator draws it) has no
    repeated row.

    A row drawn twice can land in two parts and then lies exactly on two candidate lines: a tie
    in its best line that rounding breaks either way, in the estimator and in the twin alike.
    """
    for seed in itertools.count(first_seed):
        subsample = np.random.default_rng(seed).integers(0, n_samples, size=subsample_size)
        if np.unique(subsample).size == subsample_size:
            return seed, subsample
    raise AssertionError("unreachable")


# Lines have at most 2 parameters, so the winning partitions have parts with at least as many
# rows as parameters, where least squares has one answer in any scaling.
@pytest.mark.parametrize(
    ("n_components", "n_features", "fit_intercept", "n_samples", "subsample_size", "first_seed"),
    [
        (2, 1, True, 12, 6, 0),
        (2, 1, True, 12, 6, 10),
        (2, 2, False, 14, 8, 20),
        (3, 1, True, 30, 7, 30),
        (3, 2, False, 30, 8, 40),
    ],
)
def test_algorithm_2_matches_a_brute_force_twin(
    n_components, n_features, fit_intercept, n_samples, subsample_size, first_seed
):
    X, y, *_ = make_realizable(
        n_samples,
        n_features,
        n_components,
        noise=0.3,
        fit_intercept=fit_intercept,
        random_state=first_seed,
    )
    # The estimator draws A first, uniformly with replacement, from its seeded generator.
    seed, subsample = seed_with_distinct_subsample(n_samples, subsample_size, first_seed)
    estimator = MixtureOfLinearRegressions(
        n_components,
        algorithm="subsample-exhaustive",
        subsample_size=subsample_size,
        fit_intercept=fit_intercept,
        random_state=seed,
    ).fit(X, y)
    candidate_losses, lines, loss = twin_algorithm_2(X, y, subsample, n_components, fit_intercept)
    assert len(candidate_losses) == stirling2(subsample_size, n_components)
    assert estimator.n_candidates_ == len(candidate_losses)
    assert estimator.train_loss_ == pytest.approx(loss, rel=1e-8)
    assert estimator.train_loss_ <= min(candidate_losses) * (1 + 1e-8)
    fitted = np.column_stack([estimator.coef_, estimator.intercept_])
    expected = lines if fit_intercept else np.column_stack([lines, np.zeros(n_components)])
    np.testing.assert_allclose(match_lines(fitted, expected), expected, rtol=1e-6, atol=1e-8)
    # The search's best candidate (second to last entry) is the twin's best candidate.
    assert estimator.loss_history_[-2] == pytest.approx(min(candidate_losses), rel=1e-8)


@pytest.mark.parametrize(("n_components", "subsample_size"), [(2, 9), (3, 7)])
def test_algorithm_2_result_is_no_worse_than_any_candidate(n_components, subsample_size):
    X, y, *_ = make_realizable(60, 2, n_components, noise=0.5, random_state=4)
    Z = design(X, True)
    rng = np.random.default_rng(5)
    subsample = rng.integers(0, 60, size=subsample_size)
    labels = all_partitions(subsample_size, n_components)
    candidates = fit_candidates(
        Z[subsample], y[subsample], labels, n_components, base="ls", rng=rng, min_samples=3
    )
    losses = score_candidates(Z, y, candidates)
    result = subsample_search(
        Z,
        y,
        exhaustive_partition_batches(subsample_size, n_components),
        subsample=subsample,
        n_components=n_components,
        base="ls",
        rng=rng,
        min_samples=3,
    )
    assert result.n_candidates == labels.shape[0]
    assert result.loss_history[-2] == pytest.approx(losses.min(), rel=1e-12)
    assert result.loss_history[-1] <= losses.min() * (1 + 1e-12)
    assert result.loss == pytest.approx(loop_min_loss(Z, y, result.theta), rel=1e-10)


def test_least_squares_refit_never_increases_the_min_loss():
    X, y, *_ = make_realizable(80, 2, 3, noise=0.5, random_state=6)
    Z = design(X, True)
    rng = np.random.default_rng(7)
    for _ in range(50):
        theta = rng.normal(scale=3.0, size=(3, 3))
        refitted = refit(Z, y, theta, base="ls", rng=rng, min_samples=3)
        before, after = score_candidates(Z, y, np.stack([theta, refitted]))
        assert after <= before * (1 + 1e-12)


def test_refit_keeps_a_line_that_wins_no_rows():
    X, y, *_ = make_realizable(50, 1, 2, noise=0.1, random_state=8)
    Z = design(X, True)
    theta = np.array([[0.0, 0.0], [0.0, 1e6]])  # the second line is far from every row
    refitted = refit(Z, y, theta, base="ls", rng=np.random.default_rng(0), min_samples=2)
    np.testing.assert_array_equal(refitted[1], theta[1])
    np.testing.assert_allclose(refitted[0], np.linalg.lstsq(Z, y, rcond=None)[0], rtol=1e-9)


@pytest.mark.parametrize("estimator_settings", [{"subsample_size": 150}, {"subsample_size": 40}])
def test_refit_never_increases_the_estimators_least_squares_loss(estimator_settings):
    X, y, *_ = make_realizable(300, 2, 2, noise=1.0, random_state=9)
    for seed in range(3):
        estimator = MixtureOfLinearRegressions(
            2, algorithm="subsample", n_partitions=200, random_state=seed, **estimator_settings
        ).fit(X, y)
        history = estimator.loss_history_
        assert history[-1] <= history[-2] * (1 + 1e-12)
        assert np.all(np.diff(history[:-1]) <= 0), "the best candidate so far got worse"


def test_subsample_exhaustive_too_large_is_refused_with_the_count():
    X, y, *_ = make_realizable(100, 2, 3, random_state=0)
    estimator = MixtureOfLinearRegressions(3, algorithm="subsample-exhaustive", subsample_size=40)
    with pytest.raises(ValueError) as raised:
        estimator.fit(X, y)
    message = str(raised.value)
    assert f"more than {MAX_EXHAUSTIVE_PARTITIONS:,}" in message
    assert "subsample_size=40 " in message
    assert "'subsample'" in message
    assert "subsample_size <=" in message


def test_subsample_exhaustive_default_size_stays_under_the_cap():
    X, y, *_ = make_realizable(200, 1, 2, noise=0.1, random_state=1)
    estimator = MixtureOfLinearRegressions(2, algorithm="subsample-exhaustive", random_state=0)
    estimator.fit(X, y)
    expected = stirling2(largest_enumerable_size(2, MAX_EXHAUSTIVE_PARTITIONS, limit=150), 2)
    assert estimator.n_candidates_ == expected <= MAX_EXHAUSTIVE_PARTITIONS
