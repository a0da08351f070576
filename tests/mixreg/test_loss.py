"""The min-loss and the residual computations, checked against plain loops on tiny data."""

import numpy as np
import pytest

from mixreg import min_loss, predict_lines
from mixreg._loss import CandidateScorer, assign, row_min_losses, score_candidates


def brute_force_min_loss(y, predictions):
    """(1/n) sum_i min_j (y_i - predictions[i, j])^2, one row and one line at a time."""
    total = 0.0
    for i in range(len(y)):
        best = float("inf")
        for j in range(len(predictions[i])):
            best = min(best, (y[i] - predictions[i][j]) ** 2)
        total += best
    return total / len(y)


def brute_force_predictions(X, coef, intercept):
    n_samples, n_features = X.shape
    predictions = np.empty((n_samples, coef.shape[0]))
    for i in range(n_samples):
        for j in range(coef.shape[0]):
            value = intercept[j]
            for f in range(n_features):
                value += X[i, f] * coef[j, f]
            predictions[i, j] = value
    return predictions


def test_min_loss_worked_by_hand():
    # X = [0, 1, 2]; line a is y = 0, line b is y = 3x - 1.
    y = np.array([0.0, 1.0, 4.0])
    X = np.array([[0.0], [1.0], [2.0]])
    predictions = predict_lines(X, np.array([[0.0], [3.0]]), np.array([0.0, -1.0]))
    np.testing.assert_array_equal(predictions, [[0.0, -1.0], [0.0, 2.0], [0.0, 5.0]])
    # Squared errors (line a, line b) per row: (0, 1), (1, 1), (16, 1); best: 0, 1, 1.
    expected = (0.0 + 1.0 + 1.0) / 3
    assert min_loss(y, predictions) == pytest.approx(expected, rel=1e-15)


def test_min_loss_with_one_line_is_the_mean_squared_error():
    y = np.array([1.0, -2.0, 0.5, 3.0])
    predictions = np.array([[0.0], [0.0], [1.0], [1.0]])
    # (1 + 4 + 0.25 + 4) / 4
    assert min_loss(y, predictions) == pytest.approx(9.25 / 4, rel=1e-15)


@pytest.mark.parametrize(("n_samples", "n_components"), [(1, 1), (5, 2), (7, 3), (11, 4)])
def test_min_loss_matches_a_double_loop(n_samples, n_components):
    rng = np.random.default_rng(n_samples * 10 + n_components)
    y = rng.normal(size=n_samples)
    predictions = rng.normal(size=(n_samples, n_components))
    expected = brute_force_min_loss(y.tolist(), predictions.tolist())
    assert min_loss(y, predictions) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        row_min_losses(y, predictions), np.min((predictions - y[:, None]) ** 2, axis=1)
    )


def test_min_loss_accepts_lists():
    assert min_loss([0.0, 2.0], [[1.0, 0.0], [2.0, 5.0]]) == pytest.approx(0.0)


def test_min_loss_is_zero_when_every_row_is_on_some_line():
    y = np.array([1.0, 2.0, 3.0])
    predictions = np.array([[1.0, 9.0], [9.0, 2.0], [3.0, 3.0]])
    assert min_loss(y, predictions) == 0.0


@pytest.mark.parametrize(
    ("y", "predictions"),
    [
        (np.zeros(3), np.zeros((4, 2))),  # row counts differ
        (np.zeros(3), np.zeros(3)),  # predictions not 2-D
        (np.zeros((3, 1)), np.zeros((3, 2))),  # y not 1-D
    ],
)
def test_min_loss_rejects_mismatched_shapes(y, predictions):
    with pytest.raises(ValueError, match="shape"):
        min_loss(y, predictions)


def test_min_loss_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one row"):
        min_loss(np.zeros(0), np.zeros((0, 2)))


def test_predict_lines_matches_a_loop():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    coef = rng.normal(size=(4, 3))
    intercept = rng.normal(size=4)
    predictions = predict_lines(X, coef, intercept)
    assert predictions.shape == (6, 4)
    np.testing.assert_allclose(predictions, brute_force_predictions(X, coef, intercept))


def test_predict_lines_does_not_modify_its_inputs():
    rng = np.random.default_rng(1)
    X, coef, intercept = rng.normal(size=(5, 2)), rng.normal(size=(3, 2)), rng.normal(size=3)
    copies = X.copy(), coef.copy(), intercept.copy()
    predict_lines(X, coef, intercept)
    for original, copy in zip((X, coef, intercept), copies, strict=True):
        np.testing.assert_array_equal(original, copy)


def loop_scores(Z, y, candidates):
    """Min-loss of every candidate line set: a loop over candidates calling min_loss."""
    return np.array([min_loss(y, Z @ lines.T) for lines in candidates])


@pytest.mark.parametrize(
    ("n_samples", "n_candidates", "n_components", "n_params"),
    [(9, 1, 1, 2), (13, 5, 2, 3), (10, 7, 3, 1)],
)
def test_score_candidates_matches_min_loss_per_candidate(
    n_samples, n_candidates, n_components, n_params
):
    rng = np.random.default_rng(n_samples + n_candidates)
    Z = rng.normal(size=(n_samples, n_params))
    y = rng.normal(size=n_samples)
    candidates = rng.normal(size=(n_candidates, n_components, n_params))
    losses = score_candidates(Z, y, candidates)
    assert losses.shape == (n_candidates,)
    np.testing.assert_allclose(losses, loop_scores(Z, y, candidates), rtol=1e-12)
    # And against the row-by-row definition for the first candidate.
    expected = brute_force_min_loss(y.tolist(), (Z @ candidates[0].T).tolist())
    assert losses[0] == pytest.approx(expected, rel=1e-12)


def test_score_candidates_over_many_row_blocks():
    # Enough candidates that the rows are scored in several blocks (memory stays bounded).
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(700, 3))
    y = rng.normal(size=700)
    candidates = rng.normal(size=(600, 3, 3))
    np.testing.assert_allclose(
        score_candidates(Z, y, candidates), loop_scores(Z, y, candidates), rtol=1e-10
    )


def test_score_candidates_ranks_the_true_lines_first():
    rng = np.random.default_rng(4)
    Z = np.column_stack([rng.normal(size=40), np.ones(40)])
    truth = np.array([[2.0, 1.0], [-1.0, 0.0]])
    labels = rng.integers(0, 2, size=40)
    y = np.einsum("ij,ij->i", Z, truth[labels])
    candidates = np.stack([truth + 0.5, truth, truth[::-1], truth - 0.1])
    losses = score_candidates(Z, y, candidates)
    assert losses[1] == pytest.approx(0.0, abs=1e-24)
    assert losses[2] == pytest.approx(0.0, abs=1e-24)  # the order of the lines is irrelevant
    assert losses[0] > 0 and losses[3] > 0


def assert_scorer_finds_the_exact_best(Z, y, candidates):
    exact = score_candidates(Z, y, candidates)
    index, loss = CandidateScorer(Z, y).best(candidates)
    # Exact up to the rounding of a float64 sum (rescoring a subset blocks rows differently).
    assert loss == pytest.approx(exact.min(), rel=1e-13)
    assert exact[index] == pytest.approx(exact.min(), rel=1e-13)


def test_candidate_scorer_finds_the_exact_best_among_near_ties():
    rng = np.random.default_rng(5)
    Z = np.column_stack([rng.uniform(-0.5, 0.5, size=(400, 2)), np.ones(400)])
    y = rng.uniform(-1.0, 1.0, size=400)
    base = rng.normal(scale=0.3, size=(2, 3))
    # Candidates a float32 pass cannot tell apart, and some clearly worse ones.
    near_ties = base + rng.normal(scale=1e-9, size=(200, 2, 3))
    worse = base + rng.normal(scale=0.5, size=(50, 2, 3))
    candidates = np.concatenate([worse, near_ties])
    assert_scorer_finds_the_exact_best(Z, y, candidates)


def test_candidate_scorer_rescores_what_float32_orders_wrongly():
    # Two lines at a level (700, 1000) where float32's spacing is 2**-14. Every target sits
    # 0.49 of a spacing above the lines, so float32 rounds it down onto them. Candidate
    # `on_grid` is the lines themselves; `shifted` moves both intercepts up by 0.9 of a
    # spacing, which float32 rounds to one whole spacing. Exactly, `shifted` is closer to
    # every row (0.41 against 0.49 spacings); in float32, `on_grid` fits exactly and
    # `shifted` misses by a spacing. Every float32 value involved is exact, so the wrong
    # order does not depend on the BLAS kernel.
    spacing = float(np.spacing(np.float32(1000.0)))
    assert spacing == float(np.spacing(np.float32(700.0))) == 2.0**-14
    x = np.arange(-16, 17) / 8.0
    Z = np.column_stack([x, np.ones_like(x)])
    lines = np.array([[0.5, 1000.0], [-0.25, 700.0]])
    labels = np.arange(len(x)) % 2
    y = np.einsum("ij,ij->i", Z, lines[labels]) + 0.49 * spacing
    on_grid = lines
    shifted = lines + np.array([0.0, 0.9 * spacing])
    worse = lines + np.array([0.0, 1.0])
    candidates = np.stack([worse, on_grid, shifted, worse[::-1]])
    exact = score_candidates(Z, y, candidates)
    approx = CandidateScorer(Z, y).screen(candidates)
    assert exact[2] < exact[1] < exact[0]
    assert approx[1] < approx[2] < approx[0]  # float32 alone would pick on_grid

    index, loss = CandidateScorer(Z, y).best(candidates)

    assert index == 2
    assert loss == pytest.approx(exact[2], rel=1e-13)
    assert loss == pytest.approx((0.41 * spacing) ** 2, rel=1e-6)


def test_candidate_scorer_on_many_rows_split_across_threads():
    rng = np.random.default_rng(6)
    Z = np.column_stack([rng.uniform(-0.5, 0.5, size=(20_000, 2)), np.ones(20_000)])
    y = rng.uniform(-1.0, 1.0, size=20_000)
    candidates = rng.normal(scale=0.3, size=(1, 2, 3)) + rng.normal(scale=1e-4, size=(256, 2, 3))
    assert_scorer_finds_the_exact_best(Z, y, candidates)
    approx = CandidateScorer(Z, y).screen(candidates)
    np.testing.assert_allclose(approx, score_candidates(Z, y, candidates), rtol=1e-4)


def test_candidate_scorer_with_nearly_collinear_features():
    # Least squares on small parts of nearly collinear columns gives huge, opposite
    # coefficients, where float32 predictions lose digits.
    rng = np.random.default_rng(7)
    n = 1000
    x, u = rng.normal(size=n), rng.normal(size=n)
    X = np.column_stack([x, x + 1e-5 * u])
    y = np.where(rng.integers(0, 2, size=n) == 0, u, 1.0 - u) + 0.1 * rng.normal(size=n)
    Z = np.column_stack([X / np.linalg.norm(X, axis=1).max(), np.ones(n)])
    y = y / np.abs(y).max()
    candidates = []
    for _ in range(300):
        lines = []
        for _ in range(2):
            rows = rng.choice(n, size=5, replace=False)
            lines.append(np.linalg.lstsq(Z[rows], y[rows], rcond=None)[0])
        candidates.append(lines)
    candidates = np.array(candidates)
    assert np.abs(candidates).max() > 1e3
    assert_scorer_finds_the_exact_best(Z, y, candidates)


def test_candidate_scorer_never_picks_a_non_finite_candidate():
    rng = np.random.default_rng(8)
    Z = np.column_stack([rng.normal(size=50), np.ones(50)])
    y = rng.normal(size=50)
    candidates = rng.normal(size=(6, 2, 2))
    candidates[0, 1, 0] = np.inf
    candidates[3, 0, 1] = np.nan
    candidates[4] = 1e300
    index, loss = CandidateScorer(Z, y).best(candidates)
    finite = [1, 2, 5]
    exact = score_candidates(Z, y, candidates[finite])
    assert index == finite[int(np.argmin(exact))]
    assert loss == pytest.approx(exact.min(), rel=1e-13)


def test_assign_returns_residuals_and_the_best_line():
    Z = np.array([[1.0, 1.0], [2.0, 1.0], [0.0, 1.0]])
    y = np.array([3.0, 0.0, 0.5])
    thetas = np.array([[1.0, 1.0], [0.0, 0.0]])  # y = x + 1 and y = 0
    residuals, labels = assign(Z, y, thetas)
    # Line-major: residuals[j, i] = y_i - <z_i, theta_j>.
    np.testing.assert_allclose(residuals, [[1.0, -3.0, -0.5], [3.0, 0.0, 0.5]])
    # Row 2 is equally far from both lines: the tie goes to line 0.
    np.testing.assert_array_equal(labels, [0, 1, 0])


def test_assign_breaks_ties_towards_the_lowest_index():
    Z = np.column_stack([np.linspace(-1.0, 1.0, 5), np.ones(5)])
    y = np.array([0.0, 1.0, -1.0, 2.0, 0.5])
    line = np.array([0.5, 0.25])
    # Identical lines: every row goes to the first copy.
    _, labels = assign(Z, y, np.stack([line, line, line]))
    np.testing.assert_array_equal(labels, np.zeros(5))
    # A worse line in front: every row goes to the first of the two identical best lines.
    _, labels = assign(Z, y, np.stack([line + np.array([0.0, 100.0]), line, line]))
    np.testing.assert_array_equal(labels, np.ones(5))
    # Residuals of +r and -r are a tie too.
    Z1 = np.ones((1, 1))
    _, labels = assign(Z1, np.array([0.0]), np.array([[5.0], [-5.0]]))
    np.testing.assert_array_equal(labels, [0])
    _, labels = assign(Z1, np.array([0.0]), np.array([[7.0], [-5.0], [5.0]]))
    np.testing.assert_array_equal(labels, [1])
