"""Grouped rows: every row of a group on the same line (classical AM, EM and auto)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixreg import MixtureOfLinearRegressions
from mixreg._loss import Grouping, grouped_assignment

GROUPED = ("am-classic", "em", "auto")
SLOPES = np.array([[3.0, 0.0], [-3.0, 1.0], [0.0, -3.0]])
INTERCEPTS = np.array([0.0, 4.0, -4.0])


def segments(seed: int, n_groups: int = 40, noise: float = 0.5):
    """Rows of ``n_groups`` groups (5 to 50 rows each), every group drawn from one of 3 lines.

    The lines overlap where they cross, so many single rows sit closer to a line that is not
    their group's: only the whole group tells its line.
    """
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 51, size=n_groups)
    segment = rng.permutation(np.arange(n_groups) % 3)
    groups = np.repeat(np.arange(n_groups), sizes)
    X = rng.uniform(-1.0, 1.0, size=(groups.size, 2))
    line = segment[groups]
    y = np.einsum("ij,ij->i", X, SLOPES[line]) + INTERCEPTS[line]
    y += noise * rng.standard_normal(groups.size)
    # Labels as strings, shuffled rows: nothing relies on groups being sorted or numeric.
    order = rng.permutation(groups.size)
    labels = np.array([f"user-{g}" for g in groups])
    return X[order], y[order], labels[order], segment


def same_partition(found: np.ndarray, truth: np.ndarray) -> bool:
    """Whether two labelings of the groups are the same partition (up to renaming lines)."""
    pairs = set(zip(found.tolist(), truth.tolist(), strict=True))
    return len(pairs) == len(set(found.tolist())) == len(set(truth.tolist()))


@pytest.mark.parametrize("algorithm", GROUPED)
def test_separated_segments_assign_every_group_to_its_line(algorithm):
    X, y, labels, segment = segments(0)
    model = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=0, n_init=10)
    model.fit(X, y, groups=labels)
    truth = segment[[int(label.split("-")[1]) for label in model.group_labels_]]
    assert same_partition(model.group_line_, truth)
    np.testing.assert_allclose(np.sort(model.intercept_), np.sort(INTERCEPTS), atol=0.2)
    # Each row's best line alone gets many rows wrong: the groups are what tell them apart.
    rowwise = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=0, n_init=10)
    assert rowwise.fit(X, y).train_loss_ < model.train_loss_
    if algorithm == "em":
        posterior = model.group_posterior_
        assert posterior.shape == (40, 3)
        np.testing.assert_allclose(posterior.sum(axis=1), 1.0)
        np.testing.assert_array_equal(posterior.argmax(axis=1), model.group_line_)


@pytest.mark.parametrize("algorithm", GROUPED)
def test_predict_group_gives_the_line_of_known_groups_and_minus_one_otherwise(algorithm):
    X, y, labels, _ = segments(1, n_groups=12)
    model = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=0).fit(
        X, y, groups=labels
    )
    asked = np.array(["user-3", "nobody", "user-0", "user-3", "zzz"])
    lines = model.predict_group(asked)
    known = {
        label: line for label, line in zip(model.group_labels_, model.group_line_, strict=True)
    }
    assert lines.tolist() == [known["user-3"], -1, known["user-0"], known["user-3"], -1]


def brute_force_grouped_fit(X, y, groups, k):
    """The best grouped min-loss by enumerating every assignment of the groups to k lines."""
    Z = np.column_stack([X, np.ones(len(y))])
    names = np.unique(groups)
    best = np.inf
    for assignment in itertools.product(range(k), repeat=names.size):
        line_of_row = np.array(assignment)[np.searchsorted(names, groups)]
        thetas = []
        for line in range(k):
            rows = line_of_row == line
            if rows.sum() == 0:
                thetas.append(np.zeros(Z.shape[1]))
                continue
            thetas.append(np.linalg.lstsq(Z[rows], y[rows], rcond=None)[0])
        # The loss of the lines, each group taking its best (the assignment may improve).
        total = 0.0
        for name in names:
            rows = groups == name
            total += min(float(np.sum((y[rows] - Z[rows] @ theta) ** 2)) for theta in thetas)
        best = min(best, total / len(y))
    return best


@pytest.mark.parametrize("algorithm", ["auto", "am-classic"])
def test_the_grouped_min_loss_reaches_the_brute_force_optimum_on_a_tiny_case(algorithm):
    X, y, labels, _ = segments(2, n_groups=7, noise=2.0)
    keep = np.isin(labels, np.unique(labels)[:7])
    X, y, labels = X[keep][:60], y[keep][:60], labels[keep][:60]
    optimum = brute_force_grouped_fit(X, y, labels, 2)
    model = MixtureOfLinearRegressions(2, algorithm=algorithm, random_state=0, n_init=30)
    model.fit(X, y, groups=labels)
    assert model.train_loss_ == pytest.approx(optimum, rel=1e-9)
    assert model.min_loss(X, y, groups=labels) == pytest.approx(model.train_loss_, rel=1e-12)


def test_the_grouped_min_loss_is_its_definition():
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((30, 2)), rng.standard_normal(30)
    groups = rng.integers(0, 6, size=30)
    weights = rng.uniform(0.5, 2.0, size=30)
    model = MixtureOfLinearRegressions(3, algorithm="am-classic", random_state=0).fit(X, y)
    predictions = model.predict(X)
    expected = (
        sum(
            min(
                float(
                    np.sum(
                        weights[groups == g] * (y[groups == g] - predictions[groups == g, j]) ** 2
                    )
                )
                for j in range(3)
            )
            for g in np.unique(groups)
        )
        / weights.sum()
    )
    got = model.min_loss(X, y, sample_weight=weights, groups=groups)
    assert got == pytest.approx(expected, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(
    squared=st.lists(st.floats(0, 10), min_size=12, max_size=12),
    codes=st.lists(st.integers(0, 3), min_size=4, max_size=4),
)
def test_grouped_assignment_takes_the_line_of_least_group_loss_ties_to_the_lowest(squared, codes):
    squared_arr = np.array(squared).reshape(1, 3, 4)
    codes_arr = np.array(codes)
    _, codes_arr = np.unique(codes_arr, return_inverse=True)
    grouping = Grouping.of(codes_arr)
    row_squared, labels = grouped_assignment(squared_arr, None, grouping)
    for group in range(grouping.n_groups):
        rows = codes_arr == group
        sums = [float(np.sum(squared_arr[0, j, rows])) for j in range(3)]
        chosen = int(np.argmin(sums))
        sums_again = np.add.reduce(squared_arr[0][:, rows], axis=1)
        assert set(labels[0, rows].tolist()) == {int(np.argmin(sums_again))}
        assert chosen == int(np.argmin(sums_again))
    np.testing.assert_array_equal(row_squared[0], squared_arr[0][labels[0], np.arange(4)])


@pytest.mark.parametrize("algorithm", GROUPED)
def test_a_grouped_fit_is_determined_by_its_seed(algorithm):
    X, y, labels, _ = segments(3, n_groups=15)
    first = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=11).fit(
        X, y, groups=labels
    )
    second = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=11).fit(
        X, y, groups=labels
    )
    np.testing.assert_array_equal(first.coef_, second.coef_)
    np.testing.assert_array_equal(first.group_line_, second.group_line_)


@pytest.mark.parametrize("algorithm", GROUPED)
def test_one_row_per_group_is_the_ungrouped_fit(algorithm):
    X, y, _, _ = segments(4, n_groups=10)
    ungrouped = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=2).fit(X, y)
    grouped = MixtureOfLinearRegressions(3, algorithm=algorithm, random_state=2).fit(
        X, y, groups=np.arange(len(y))
    )
    # EM sums a group's log-densities before adding the log-weight: the same numbers to
    # rounding; the assignment algorithms take the very same steps.
    tolerance = 1e-10 if algorithm == "em" else 0.0
    np.testing.assert_allclose(grouped.coef_, ungrouped.coef_, rtol=0, atol=tolerance)
    np.testing.assert_allclose(grouped.intercept_, ungrouped.intercept_, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(grouped.group_line_, ungrouped.best_component(X, y))


def test_weighted_groups_weigh_their_rows_and_zero_weight_groups_vanish():
    X, y, labels, _ = segments(6, n_groups=12)
    weights = np.random.default_rng(6).integers(0, 3, size=len(y)).astype(float)
    weights[labels == "user-5"] = 0.0
    model = MixtureOfLinearRegressions(3, algorithm="am-classic", random_state=0).fit(
        X, y, sample_weight=weights, groups=labels
    )
    assert "user-5" not in model.group_labels_.tolist()
    assert model.predict_group(["user-5"]).tolist() == [-1]
    repeats = weights.astype(int)
    repeated = MixtureOfLinearRegressions(
        3, algorithm="am-classic", init=np.column_stack([model.coef_, model.intercept_])
    ).fit(np.repeat(X, repeats, axis=0), np.repeat(y, repeats), groups=np.repeat(labels, repeats))
    np.testing.assert_allclose(repeated.coef_, model.coef_, atol=1e-9)


@pytest.mark.parametrize("algorithm", ["am", "subsample", "subsample+am", "subsample-exhaustive"])
def test_algorithms_without_groups_refuse_them_naming_the_ones_that_do(algorithm):
    X, y, labels, _ = segments(7, n_groups=5)
    with pytest.raises(ValueError, match=r"groups: algorithm=.* does not fit groups; use one of"):
        MixtureOfLinearRegressions(2, algorithm=algorithm).fit(X, y, groups=labels)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (lambda n: np.arange(n - 1), "groups has 59 labels but X has 60 rows"),
        (lambda n: np.r_[np.arange(n - 1), np.nan], r"groups\[59\] is missing"),
        (lambda n: [None] + ["a"] * (n - 1), r"groups\[0\] is missing"),
        (lambda n: np.zeros((n, 2)), "groups must be 1-dimensional"),
    ],
)
def test_bad_groups_are_refused_naming_groups(groups, message):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((60, 2)), rng.standard_normal(60)
    with pytest.raises(ValueError, match=message):
        MixtureOfLinearRegressions(2, algorithm="am-classic").fit(X, y, groups=groups(60))


def grouped_log_likelihood(X, y, labels, coef, intercept, noise_variance, weights):
    """``sum_g log sum_j w_j prod_{i in g} N(y_i; <x_i, coef_j> + intercept_j, sigma_j^2)``."""
    _, codes = np.unique(labels, return_inverse=True)
    residuals = y[:, None] - (X @ coef.T + intercept)
    log_density = -0.5 * np.log(2.0 * np.pi * noise_variance) - residuals**2 / (2 * noise_variance)
    by_group = np.zeros((codes.max() + 1, len(weights)))
    np.add.at(by_group, codes, log_density)
    return float(np.logaddexp.reduce(by_group + np.log(weights), axis=1).sum())


@pytest.mark.parametrize("seed", range(4))
def test_grouped_auto_is_never_worse_than_grouped_em_from_the_same_seed(seed):
    # Noisy rows in small groups: single rows seldom tell their line, some groups neither.
    X, y, labels, _ = segments(seed, n_groups=60, noise=3.0)
    fitted = {
        algorithm: MixtureOfLinearRegressions(
            3, algorithm=algorithm, n_init=5, random_state=seed
        ).fit(X, y, groups=labels)
        for algorithm in ("em", "auto")
    }
    em, auto = fitted["em"], fitted["auto"]
    em_likelihood = grouped_log_likelihood(
        X, y, labels, em.coef_, em.intercept_, em.noise_variance_, em.weights_
    )
    auto_likelihood = grouped_log_likelihood(
        X, y, labels, auto.ml_coef_, auto.ml_intercept_, auto.noise_variance_, auto.weights_
    )
    assert auto.log_likelihood_ == pytest.approx(auto_likelihood, rel=1e-9)
    assert auto_likelihood >= em_likelihood - 1e-9 * abs(em_likelihood)
    # Its min-loss lines are classical AM's polish of EM's fits: never worse in min-loss.
    assert auto.train_loss_ <= em.min_loss(X, y, groups=labels) * (1 + 1e-12)


def test_an_ungrouped_refit_keeps_no_mixture_of_the_grouped_fit():
    X, y, labels, _ = segments(5, n_groups=12)
    model = MixtureOfLinearRegressions(3, random_state=0).fit(X, y, groups=labels)
    assert model.ml_coef_.shape == model.coef_.shape
    model.fit(X, y)
    for name in ("ml_coef_", "ml_intercept_", "weights_", "noise_variance_", "log_likelihood_"):
        assert not hasattr(model, name), name


def test_grouped_auto_stops_after_its_em_starts_only_when_half_agree():
    X, y, labels, _ = segments(0)
    settled = MixtureOfLinearRegressions(3, n_init=5, random_state=0).fit(X, y, groups=labels)
    assert [candidate["source"] for candidate in settled.candidates_] == ["em"] * 5
    # One start cannot agree with another: the search goes on with the other sources and moves.
    searched = MixtureOfLinearRegressions(3, n_init=1, random_state=0).fit(X, y, groups=labels)
    sources = {candidate["source"] for candidate in searched.candidates_}
    assert {"em", "subsample+am", "split and free"} <= sources
    assert searched.train_loss_ == pytest.approx(settled.train_loss_, rel=1e-9)


def test_a_grouped_auto_fit_on_many_rows_searches_on_whole_groups():
    # Beyond the search sample's 20,000 rows the search draws whole groups; the finalists
    # are polished on all rows, so every group still gets its line.
    X, y, labels, segment = segments(8, n_groups=900, noise=0.3)
    assert len(y) > 20_000
    model = MixtureOfLinearRegressions(3, random_state=0, n_init=4).fit(X, y, groups=labels)
    truth = segment[[int(label.split("-")[1]) for label in model.group_labels_]]
    assert same_partition(model.group_line_, truth)
