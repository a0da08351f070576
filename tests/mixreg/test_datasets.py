"""The paper's data generators: shapes, seeding, and that the data are what they claim."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from mixreg.datasets import (
    make_friedman,
    make_realizable,
    make_shared_accounts,
    make_two_regressions,
)


@pytest.mark.parametrize(
    ("variant", "n_features", "expected_features"),
    [(1, None, 5), (1, 10, 10), (2, None, 4), (3, 4, 4)],
)
def test_friedman_shapes(variant, n_features, expected_features):
    X_train, y_train, X_test, y_test = make_friedman(
        variant, n_train=120, n_test=30, n_features=n_features, random_state=0
    )
    assert X_train.shape == (120, expected_features)
    assert y_train.shape == (120,)
    assert X_test.shape == (30, expected_features)
    assert y_test.shape == (30,)
    assert X_train.dtype == y_train.dtype == np.float64


def test_friedman_defaults_are_the_papers_sizes():
    X_train, _, X_test, _ = make_friedman(1, random_state=0)
    assert X_train.shape == (3200, 5)
    assert X_test.shape == (800, 5)


def test_friedman_noise_is_the_requested_one():
    # Friedman 3's noise-free target is an arctan in (-pi/2, pi/2); noise 4.0 dominates it,
    # so the target's spread must be close to 4 and far from the noise-free spread.
    _, y_noisy, _, _ = make_friedman(3, n_train=4000, n_test=1, noise=4.0, random_state=1)
    _, y_clean, _, _ = make_friedman(3, n_train=4000, n_test=1, noise=0.0, random_state=1)
    assert np.std(y_clean) < 1.0
    assert 3.8 < np.std(y_noisy - y_clean) < 4.2


@pytest.mark.parametrize("variant", [1, 2, 3])
def test_friedman_is_deterministic_under_a_seed(variant):
    first = make_friedman(variant, n_train=50, n_test=10, random_state=7)
    second = make_friedman(variant, n_train=50, n_test=10, random_state=7)
    third = make_friedman(variant, n_train=50, n_test=10, random_state=8)
    for a, b, c in zip(first, second, third, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_a_generator_is_accepted_and_advanced():
    rng = np.random.default_rng(3)
    first = make_friedman(1, n_train=40, n_test=10, random_state=rng)
    second = make_friedman(1, n_train=40, n_test=10, random_state=rng)
    again = make_friedman(1, n_train=40, n_test=10, random_state=np.random.default_rng(3))
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[0], second[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variant": 4}, "variant must be 1, 2 or 3"),
        ({"variant": 2, "n_features": 5}, "always has 4 features"),
        ({"variant": 1, "n_features": 3}, "n_features must be an integer >= 5"),
        ({"variant": 1, "n_train": 0}, "n_train must be an integer >= 1"),
        ({"variant": 1, "noise": -1.0}, "noise must be a finite number >= 0"),
    ],
)
def test_friedman_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_friedman(**kwargs)


def test_two_regressions_shapes_and_sources():
    X_train, y_train, X_test, y_test, source_train, source_test = make_two_regressions(
        n_train=300, n_test=101, n_features=3, random_state=0
    )
    assert X_train.shape == (300, 3)
    assert y_train.shape == source_train.shape == (300,)
    assert X_test.shape == (101, 3)
    assert y_test.shape == source_test.shape == (101,)
    sources = np.concatenate([source_train, source_test])
    assert set(np.unique(sources)) == {0, 1}
    # 401 rows: the first source gets the extra one.
    assert np.bincount(sources).tolist() == [201, 200]


def test_two_regressions_defaults_are_the_papers_sizes():
    X_train, _, X_test, _, _, _ = make_two_regressions(random_state=0)
    assert X_train.shape == (3200, 4)
    assert X_test.shape == (800, 4)


def test_two_regressions_rows_are_shuffled_between_train_and_test():
    _, _, _, _, source_train, _ = make_two_regressions(n_train=400, n_test=400, random_state=2)
    # Without shuffling the training rows would all come from source 0.
    assert 0.35 < source_train.mean() < 0.65


def test_each_source_is_a_noisy_line_with_its_bias():
    X, y, _, _, source, _ = make_two_regressions(
        n_train=3000, n_test=10, noise=4.0, biases=(100.0, 0.0), random_state=5
    )
    for label, bias in [(0, 100.0), (1, 0.0)]:
        rows = source == label
        line = LinearRegression().fit(X[rows], y[rows])
        residual_variance = np.mean((y[rows] - line.predict(X[rows])) ** 2)
        assert 14.0 < residual_variance < 18.0  # noise 4.0 squared
        assert abs(line.intercept_ - bias) < 1.0
    # One line for both sources is far worse: the mixture is really two lines.
    pooled = LinearRegression().fit(X, y)
    assert np.mean((y - pooled.predict(X)) ** 2) > 10 * 16.0


def test_two_regressions_is_deterministic_under_a_seed():
    first = make_two_regressions(n_train=60, n_test=20, random_state=11)
    second = make_two_regressions(n_train=60, n_test=20, random_state=11)
    third = make_two_regressions(n_train=60, n_test=20, random_state=12)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], third[0])
    assert not np.array_equal(first[1], third[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"biases": (1.0, 2.0, 3.0)}, "biases must be two finite numbers"),
        ({"biases": (np.nan, 0.0)}, "biases must be two finite numbers"),
        ({"n_features": 0}, "n_features must be an integer >= 1"),
        ({"n_test": 2.5}, "n_test must be an integer >= 1"),
    ],
)
def test_two_regressions_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_two_regressions(**kwargs)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize(("n_features", "n_components"), [(1, 2), (3, 3), (5, 4)])
def test_realizable_shapes(n_features, n_components, fit_intercept):
    X, y, coef, intercept, labels = make_realizable(
        n_samples=200,
        n_features=n_features,
        n_components=n_components,
        fit_intercept=fit_intercept,
        random_state=0,
    )
    assert X.shape == (200, n_features)
    assert y.shape == labels.shape == (200,)
    assert coef.shape == (n_components, n_features)
    assert intercept.shape == (n_components,)
    assert np.bincount(labels, minlength=n_components).min() >= 200 // n_components
    if not fit_intercept:
        np.testing.assert_array_equal(intercept, 0.0)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_realizable_rows_lie_on_their_lines_up_to_the_noise(fit_intercept):
    noise = 0.5
    X, y, coef, intercept, labels = make_realizable(
        n_samples=20_000,
        n_features=3,
        n_components=3,
        noise=noise,
        fit_intercept=fit_intercept,
        random_state=4,
    )
    residual = y - np.einsum("ij,ij->i", X, coef[labels]) - intercept[labels]
    assert abs(residual.mean()) < 0.02
    assert abs(residual.std() - noise) < 0.02
    # Per line, least squares on that line's rows recovers it.
    for j in range(3):
        rows = labels == j
        line = LinearRegression(fit_intercept=fit_intercept).fit(X[rows], y[rows])
        np.testing.assert_allclose(line.coef_, coef[j], atol=0.05)
        assert abs(line.intercept_ - intercept[j]) < 0.05


def test_realizable_without_noise_is_exact():
    X, y, coef, intercept, labels = make_realizable(
        n_samples=100, n_features=2, n_components=2, noise=0.0, random_state=9
    )
    np.testing.assert_allclose(y, np.einsum("ij,ij->i", X, coef[labels]) + intercept[labels])


def test_realizable_lines_are_well_separated():
    _, _, coef, intercept, _ = make_realizable(
        n_features=1, n_components=3, fit_intercept=True, random_state=1
    )
    params = np.column_stack([coef, intercept])
    for a in range(3):
        for b in range(a + 1, 3):
            assert np.linalg.norm(params[a] - params[b]) >= 2.0


def test_realizable_is_deterministic_under_a_seed():
    first = make_realizable(n_samples=50, random_state=21)
    second = make_realizable(n_samples=50, random_state=21)
    third = make_realizable(n_samples=50, random_state=22)
    for a, b, c in zip(first, second, third, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_realizable_refuses_lines_that_cannot_be_separated():
    # Forty lines through the origin on one feature: slopes cannot all be 2 apart at scale 3.
    with pytest.raises(ValueError, match="could not draw 40 lines"):
        make_realizable(n_features=1, n_components=40, fit_intercept=False, random_state=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_samples": 0}, "n_samples must be an integer >= 1"),
        ({"n_components": True}, "n_components must be an integer >= 1"),
        ({"noise": np.inf}, "noise must be a finite number >= 0"),
    ],
)
def test_realizable_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_realizable(**kwargs)


def test_shared_accounts_mix_people_whose_ratings_are_lines_of_the_item():
    X, y, account, person = make_shared_accounts(
        n_accounts=20, n_ratings=150, n_features=3, noise=0.2, random_state=8
    )
    assert X.shape == (3000, 3) and y.shape == account.shape == person.shape == (3000,)
    assert np.all(np.bincount(account) == 150)
    people_per_account = [len(np.unique(person[account == a])) for a in range(20)]
    assert set(people_per_account) <= {2, 3} and len(set(people_per_account)) == 2
    for a in range(20):
        for p in np.unique(person[account == a]):
            rows = (account == a) & (person == p)
            line = LinearRegression().fit(X[rows], y[rows])
            residuals = y[rows] - line.predict(X[rows])
            assert 0.1 < residuals.std() < 0.3
    again = make_shared_accounts(
        n_accounts=20, n_ratings=150, n_features=3, noise=0.2, random_state=8
    )
    np.testing.assert_array_equal(again[1], y)
    with pytest.raises(ValueError, match="people"):
        make_shared_accounts(people=(3, 2))
