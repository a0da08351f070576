"""RANSAC with scikit-learn's RANSACRegressor semantics, batched over parts."""

import numpy as np
import pytest
import sklearn.linear_model._ransac as sklearn_ransac
from sklearn.linear_model import LinearRegression, RANSACRegressor
from sklearn.linear_model._ransac import _dynamic_max_trials

import mixreg._ransac as mixreg_ransac
from mixreg._ransac import (
    MAX_TRIALS,
    STOP_PROBABILITY,
    _sequential_best,
    dynamic_max_trials,
    ransac_lines,
)


def design(X):
    return np.column_stack([X, np.ones(len(X))])


def median_absolute_deviation(y):
    return np.median(np.abs(y - np.median(y)))


def line_with_outliers(rng, n_inliers, n_outliers, n_features, noise):
    """Rows on one line (plus optional small noise) and rows far off it, shuffled."""
    coef = rng.uniform(1.0, 3.0, size=n_features) * rng.choice([-1.0, 1.0], size=n_features)
    intercept = 1.5
    X = rng.normal(size=(n_inliers + n_outliers, n_features))
    y = X @ coef + intercept + noise * rng.normal(size=len(X))
    offsets = rng.uniform(30.0, 60.0, size=n_outliers) * rng.choice([-1.0, 1.0], n_outliers)
    y[n_inliers:] += offsets
    order = rng.permutation(len(X))
    is_inlier = np.arange(len(X)) < n_inliers
    return X[order], y[order], is_inlier[order], np.append(coef, intercept)


def fit_one_part(X, y, rng):
    """mixreg's RANSAC line of the part made of every row."""
    n = len(X)
    return ransac_lines(
        design(X), y, np.arange(n)[None, :], np.array([n]), rng, min_samples=X.shape[1] + 1
    )[0]


@pytest.mark.parametrize(("n_features", "noise"), [(1, 0.0), (2, 0.0), (1, 0.01), (3, 0.01)])
def test_agrees_with_ransac_regressor_on_an_unambiguous_line(n_features, noise):
    rng = np.random.default_rng(n_features)
    X, y, is_inlier, truth = line_with_outliers(rng, 80, 20, n_features, noise)
    theta = fit_one_part(X, y, np.random.default_rng(0))
    reference = RANSACRegressor(random_state=0).fit(X, y)
    np.testing.assert_array_equal(reference.inlier_mask_, is_inlier)
    np.testing.assert_allclose(
        theta,
        np.append(reference.estimator_.coef_, reference.estimator_.intercept_),
        rtol=1e-9,
        atol=1e-9,
    )
    # The same inlier set: the rows within the threshold of mixreg's line.
    threshold = median_absolute_deviation(y)
    np.testing.assert_array_equal(np.abs(y - design(X) @ theta) <= threshold, is_inlier)
    if noise == 0.0:
        np.testing.assert_allclose(theta, truth, rtol=1e-9)


def test_every_part_of_a_batch_recovers_its_own_line():
    rng = np.random.default_rng(5)
    blocks = [line_with_outliers(rng, 40, 10, 2, 0.0) for _ in range(30)]
    Z = np.concatenate([design(X) for X, *_ in blocks])
    y = np.concatenate([block[1] for block in blocks])
    parts = np.arange(len(y)).reshape(30, 50)
    theta = ransac_lines(Z, y, parts, np.full(30, 50), np.random.default_rng(0), min_samples=3)
    np.testing.assert_allclose(theta, np.stack([block[3] for block in blocks]), rtol=1e-9)


def test_same_generator_state_gives_the_same_lines():
    rng = np.random.default_rng(6)
    Z = design(rng.normal(size=(60, 2)))
    y = rng.normal(size=60)
    parts = np.stack([rng.permutation(60)[:25] for _ in range(8)])
    sizes = np.full(8, 25)
    first = ransac_lines(Z, y, parts, sizes, np.random.default_rng(1), min_samples=3)
    second = ransac_lines(Z, y, parts, sizes, np.random.default_rng(1), min_samples=3)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("probability", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_dynamic_max_trials_matches_sklearn(probability):
    for n_samples in (1, 2, 5, 17, 100):
        for n_inliers in range(n_samples + 1):
            for min_samples in (1, 2, 3, 5):
                got = dynamic_max_trials(
                    np.array([float(n_inliers)]),
                    np.array([float(n_samples)]),
                    min_samples,
                    probability,
                )[0]
                expected = _dynamic_max_trials(n_inliers, n_samples, min_samples, probability)
                assert got == expected, (n_inliers, n_samples, min_samples, probability)


def sklearn_trial_loop(counts, scores, n_samples, min_samples, max_trials, probability):
    """The trial-selection rules of RANSACRegressor.fit, with precomputed inlier counts and
    scores per trial. Returns the index of the kept trial (None when none is kept)."""
    n_inliers_best = 1
    score_best = -np.inf
    best = None
    n_trials = 0
    while n_trials < max_trials:
        n_trials += 1
        trial = n_trials - 1
        if counts[trial] < n_inliers_best:
            continue
        if counts[trial] == n_inliers_best and scores[trial] < score_best:
            continue
        n_inliers_best = counts[trial]
        score_best = scores[trial]
        best = trial
        max_trials = min(
            max_trials,
            _dynamic_max_trials(n_inliers_best, n_samples, min_samples, probability),
        )
    return best


@pytest.mark.parametrize("min_samples", [2, 3])
def test_sequential_best_reproduces_the_trial_loop(min_samples):
    rng = np.random.default_rng(min_samples)
    n_parts = 400
    sizes = rng.integers(min_samples, 40, size=n_parts)
    # Few distinct counts and scores, so exact ties are frequent.
    counts = np.stack([rng.integers(0, size + 1, size=MAX_TRIALS) // 3 * 3 for size in sizes])
    counts = np.minimum(counts, sizes[:, None])
    scores = rng.choice([-0.5, 0.0, 0.25, 0.9], size=(n_parts, MAX_TRIALS))
    chosen = _sequential_best(counts, scores, sizes, min_samples, MAX_TRIALS, STOP_PROBABILITY)
    for part in range(n_parts):
        expected = sklearn_trial_loop(
            counts[part], scores[part], sizes[part], min_samples, MAX_TRIALS, STOP_PROBABILITY
        )
        if expected is None:
            # No trial has an inlier: the caller falls back to the whole part.
            assert counts[part].max() == 0
        else:
            assert chosen[part] == expected, part


def test_sequential_best_later_trial_wins_an_exact_tie():
    counts = np.array([[4, 6, 6, 6, 2]])
    scores = np.array([[0.9, 0.5, 0.7, 0.7, 1.0]])
    chosen = _sequential_best(counts, scores, np.array([1000]), 2, 5, STOP_PROBABILITY)
    assert chosen[0] == sklearn_trial_loop(counts[0], scores[0], 1000, 2, 5, STOP_PROBABILITY)
    assert chosen[0] == 3


def test_sequential_best_stops_where_the_dynamic_bound_says():
    # With all 10 rows inliers the bound is 1 trial: the first trial is kept, later ones are
    # never drawn even if better by score.
    counts = np.array([[10, 10, 10]])
    scores = np.array([[0.1, 0.9, 0.9]])
    chosen = _sequential_best(counts, scores, np.array([10]), 2, 3, STOP_PROBABILITY)
    assert chosen[0] == 0


def test_sequential_best_waits_for_a_first_trial_with_inliers():
    # A small part whose first trials find no inlier (e.g. a threshold of zero when most
    # targets are equal). RANSACRegressor keeps drawing up to max_trials until one has an
    # inlier; until then no early-stopping bound applies.
    counts = np.array([[0] * 50 + [2] * 50])
    scores = np.zeros((1, 100))
    chosen = _sequential_best(counts, scores, np.array([3]), 2, 100, STOP_PROBABILITY)
    assert sklearn_trial_loop(counts[0], scores[0], 3, 2, 100, STOP_PROBABILITY) == 50
    assert chosen[0] == 50


class FixedTrials:
    """Stand-in for both libraries' random minimal-subset draws, replaying given positions.

    ``picks[part, trial]`` holds the positions (within the part) of one trial's rows.
    """

    def __init__(self, picks):
        self.picks = picks
        self.next_part = 0
        self.sklearn_trials = None

    def mixreg_sampler(self, rng, sizes, n_trials, n_picks):
        # Parts are drawn for in order, possibly over several blocks: hand out the next ones.
        picks = self.picks[self.next_part : self.next_part + len(sizes)]
        self.next_part += len(sizes)
        assert picks.shape == (len(sizes), n_trials, n_picks)
        assert np.all(picks.max(axis=(1, 2)) < sizes)
        return picks.copy()

    def sklearn_sampler(self, n_population, n_samples, random_state=None):
        return next(self.sklearn_trials).copy()

    def for_sklearn(self, part):
        self.sklearn_trials = iter(self.picks[part])


def random_trials(rng, sizes, min_samples):
    return np.stack(
        [
            [rng.choice(size, size=min_samples, replace=False) for _ in range(MAX_TRIALS)]
            for size in sizes
        ]
    )


@pytest.fixture
def fixed_trials(monkeypatch):
    """Install a FixedTrials replay in mixreg's and scikit-learn's RANSAC."""

    def install(picks):
        trials = FixedTrials(picks)
        monkeypatch.setattr(mixreg_ransac, "_sample_without_replacement", trials.mixreg_sampler)
        monkeypatch.setattr(sklearn_ransac, "sample_without_replacement", trials.sklearn_sampler)
        return trials

    return install


def noisy_parts(rng, n_parts, n_features):
    """Parts of a shared pool of rows: two noisy lines plus a few outliers, so the consensus
    and the early stop both matter."""
    n_rows = 200
    X = rng.normal(size=(n_rows, n_features))
    line = rng.integers(0, 2, size=n_rows)
    coef = np.array([np.full(n_features, 2.0), np.full(n_features, -1.0)])
    y = np.einsum("ij,ij->i", X, coef[line]) + 0.3 * rng.normal(size=n_rows)
    y[rng.random(n_rows) < 0.1] += 20.0
    sizes = rng.integers(n_features + 1, 60, size=n_parts)
    parts = np.zeros((n_parts, sizes.max()), dtype=np.intp)
    for part, size in enumerate(sizes):
        parts[part, :size] = rng.choice(n_rows, size=size, replace=False)
    return X, y, parts, sizes


@pytest.mark.parametrize("n_features", [1, 2])
def test_matches_ransac_regressor_given_the_same_trials(fixed_trials, n_features):
    rng = np.random.default_rng(10 + n_features)
    X, y, parts, sizes = noisy_parts(rng, 12, n_features)
    min_samples = n_features + 1
    trials = fixed_trials(random_trials(rng, sizes, min_samples))
    theta = ransac_lines(design(X), y, parts, sizes, rng, min_samples=min_samples)
    for part, size in enumerate(sizes):
        rows = parts[part, :size]
        trials.for_sklearn(part)
        reference = RANSACRegressor(random_state=0).fit(X[rows], y[rows])
        expected = np.append(reference.estimator_.coef_, reference.estimator_.intercept_)
        np.testing.assert_allclose(theta[part], expected, rtol=1e-8, atol=1e-10)


def test_batched_parts_equal_one_part_at_a_time(fixed_trials):
    rng = np.random.default_rng(20)
    X, y, parts, sizes = noisy_parts(rng, 25, 2)
    trials = fixed_trials(random_trials(rng, sizes, 3))
    Z = design(X)
    batched = ransac_lines(Z, y, parts, sizes, rng, min_samples=3)
    for part in range(len(sizes)):
        trials.next_part = part
        alone = ransac_lines(
            Z, y, parts[part : part + 1], sizes[part : part + 1], rng, min_samples=3
        )
        np.testing.assert_allclose(batched[part], alone[0], rtol=1e-12, atol=1e-14)


def test_residual_threshold_is_the_median_absolute_deviation_of_y(fixed_trials):
    rng = np.random.default_rng(30)
    n = 41
    X = rng.normal(size=(n, 1))
    clean_line = np.array([2.0, 1.0])
    y = design(X) @ clean_line
    # Rows 0 and 1 stay on the line and make every trial; the others sit at spread offsets.
    y[2:] += rng.uniform(-4.0, 4.0, size=n - 2)
    threshold = median_absolute_deviation(y)
    distance = np.abs(y - design(X) @ clean_line)
    picks = np.broadcast_to(np.array([0, 1]), (1, MAX_TRIALS, 2)).copy()
    fixed_trials(picks)
    theta = ransac_lines(design(X), y, np.arange(n)[None, :], np.array([n]), rng, min_samples=2)[0]

    def lstsq_within(limit):
        rows = distance <= limit
        return np.linalg.lstsq(design(X)[rows], y[rows], rcond=None)[0]

    np.testing.assert_allclose(theta, lstsq_within(threshold), rtol=1e-9)
    # The data discriminate: a somewhat smaller or larger threshold keeps other rows.
    for other in (0.8 * threshold, 1.25 * threshold):
        assert np.sum(distance <= other) != np.sum(distance <= threshold)
        assert not np.allclose(theta, lstsq_within(other), rtol=1e-6)


def test_parts_smaller_than_min_samples_fall_back_to_least_squares():
    rng = np.random.default_rng(40)
    Z = design(rng.normal(size=(30, 2)))
    y = rng.normal(size=30)
    parts = np.zeros((3, 30), dtype=np.intp)
    parts[0, :1] = [4]
    parts[1, :2] = [7, 9]
    parts[2, :30] = np.arange(30)
    sizes = np.array([1, 2, 30])
    with np.errstate(all="raise"):
        theta = ransac_lines(Z, y, parts, sizes, rng, min_samples=3)
    assert np.all(np.isfinite(theta))
    # Fewer rows than parameters: a least-squares line passes through them.
    np.testing.assert_allclose(Z[[4]] @ theta[0], y[[4]], atol=1e-9)
    np.testing.assert_allclose(Z[[7, 9]] @ theta[1], y[[7, 9]], atol=1e-9)


def test_parts_between_the_parameter_count_and_min_samples_get_their_least_squares_line():
    # Without an intercept column a line has d parameters but RANSAC draws d + 1 rows; a part
    # of 4 rows with min_samples=5 is an over-determined least-squares problem.
    rng = np.random.default_rng(45)
    Z = rng.normal(size=(20, 2))
    y = rng.normal(size=20)
    parts = np.zeros((2, 20), dtype=np.intp)
    parts[0, :4] = [3, 8, 11, 17]
    parts[1] = np.arange(20)
    theta = ransac_lines(Z, y, parts, np.array([4, 20]), rng, min_samples=5)
    expected = np.linalg.lstsq(Z[[3, 8, 11, 17]], y[[3, 8, 11, 17]], rcond=None)[0]
    np.testing.assert_allclose(theta[0], expected, rtol=1e-9)


def test_empty_part_is_finite():
    rng = np.random.default_rng(41)
    Z = design(rng.normal(size=(10, 1)))
    y = rng.normal(size=10)
    parts = np.zeros((2, 10), dtype=np.intp)
    parts[1] = np.arange(10)
    with np.errstate(all="raise"):
        theta = ransac_lines(Z, y, parts, np.array([0, 10]), rng, min_samples=2)
    np.testing.assert_array_equal(theta[0], [0.0, 0.0])
    assert np.all(np.isfinite(theta[1]))


def test_duplicated_rows_give_finite_lines():
    # Sub-samples are drawn with replacement: parts repeat rows, so minimal subsets can be
    # singular (the same row twice).
    rng = np.random.default_rng(42)
    Z = design(rng.normal(size=(6, 2)))
    y = rng.normal(size=6)
    parts = np.array([[0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, 2], [3, 3, 4, 4, 5, 5]])
    with np.errstate(all="raise"):
        theta = ransac_lines(Z, y, parts, np.full(3, 6), rng, min_samples=3)
    assert np.all(np.isfinite(theta))
    # A part that is one row repeated is fitted through that row.
    assert Z[2] @ theta[1] == pytest.approx(y[2], abs=1e-9)


def test_singular_trial_is_fitted_like_linear_regression(fixed_trials):
    # Every trial draws the same row twice. RANSACRegressor fits such a subset with
    # LinearRegression (slope 0, intercept the row's y), which sets the consensus; mixreg must
    # do the same.
    rng = np.random.default_rng(43)
    n = 30
    X = rng.normal(size=(n, 1))
    y = 2.0 * X[:, 0] + 1.0 + 0.5 * rng.normal(size=n)
    X[1], y[1] = X[0], y[0]
    picks = np.broadcast_to(np.array([0, 1]), (1, MAX_TRIALS, 2)).copy()
    trials = fixed_trials(picks)
    theta = ransac_lines(design(X), y, np.arange(n)[None, :], np.array([n]), rng, min_samples=2)[0]
    trials.for_sklearn(0)
    reference = RANSACRegressor(random_state=0).fit(X, y)
    trial_fit = LinearRegression().fit(X[[0, 1]], y[[0, 1]])
    assert trial_fit.coef_[0] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(
        theta,
        np.append(reference.estimator_.coef_, reference.estimator_.intercept_),
        rtol=1e-9,
    )


def _fit_minimal_subsets_twin(Zs, ys, fit_intercept, repeated):
    """The minimal-subset fits as first written: one solve of the whole stack and, when one
    system has a zero pivot, determinants of all and a second solve (``repeated`` unused)."""
    n_params = Zs.shape[-1]
    try:
        return np.linalg.solve(Zs, ys[..., None])[..., 0]
    except np.linalg.LinAlgError:
        pass
    det = np.linalg.det(Zs)
    singular = ~np.isfinite(det) | (det == 0.0)
    safe = np.where(singular[..., None, None], np.eye(n_params), Zs)
    theta = np.linalg.solve(safe, ys[..., None])[..., 0]
    theta[singular] = mixreg_ransac._lstsq_like_linear_regression(
        Zs[singular], ys[singular], fit_intercept
    )
    return theta


@pytest.mark.parametrize("n_features", [1, 3, 5])
def test_repeated_rows_set_aside_give_the_same_lines_bit_for_bit(monkeypatch, n_features):
    """A sub-sample drawn with replacement (many minimal subsets hold a row twice, and some
    rows of the data are equal too): the lines are exactly those of the straightforward fits."""
    rng = np.random.default_rng(n_features)
    X, y, _, _ = line_with_outliers(rng, 60, 20, n_features, noise=0.3)
    X[5], y[5] = X[6], y[6]  # two equal rows of the data, not one row drawn twice
    drawn = rng.integers(0, len(X), size=150)
    Z, ys = design(X[drawn]), y[drawn]
    labels = rng.integers(0, 3, size=(40, 150))
    from mixreg._subsample import fit_candidates

    def candidates():
        return fit_candidates(
            Z,
            ys,
            labels,
            3,
            base="ransac",
            rng=np.random.default_rng(7),
            min_samples=n_features + 1,
        )

    fast = candidates()
    monkeypatch.setattr(mixreg_ransac, "_fit_minimal_subsets", _fit_minimal_subsets_twin)
    straightforward = candidates()
    assert np.array_equal(fast, straightforward)


def test_equal_row_ids_name_equal_rows_alike():
    Z = np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [1.0, 2.5]])
    ids = mixreg_ransac.equal_row_ids(Z)
    assert ids[0] == ids[2]
    assert len({ids[0], ids[1], ids[3]}) == 3
