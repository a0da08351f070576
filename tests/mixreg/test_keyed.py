"""fit_per_key: every key's lines as good as the key fitted alone, small and odd keys reported."""

import itertools
import time

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions, UnknownKeyError, fit_per_key, min_loss
from mixreg.datasets import make_shared_accounts
from mixreg.service_support import STATUSES


def _brute_force_min_loss(x, y):
    """The exact minimum of the min-loss of two lines on one feature: every partition of the
    rows into two parts (the first row always in part 0), a least-squares line per part."""
    n = x.shape[0]
    tails = np.array(list(itertools.product([0, 1], repeat=n - 1)), dtype=bool)
    in_part = np.hstack([np.zeros((tails.shape[0], 1), dtype=bool), tails])
    Z = np.column_stack([x, np.ones(n)])
    total = np.zeros(in_part.shape[0])
    for rows in (in_part, ~in_part):
        weights = rows.astype(float)
        gram = np.einsum("pn,ni,nj->pij", weights, Z, Z) + 1e-12 * np.eye(2)
        theta = np.linalg.solve(gram, np.einsum("pn,ni,n->pi", weights, Z, y)[:, :, None])[..., 0]
        total += np.sum(weights * (y - theta @ Z.T) ** 2, axis=1)
    return float(total.min()) / n


def test_every_key_reaches_the_brute_force_minimum():
    rng = np.random.default_rng(3)
    n_keys, n_rows = 200, 10
    x = rng.standard_normal(n_keys * n_rows)
    slopes = rng.normal(0, 3, size=(n_keys, 2))
    side = rng.integers(0, 2, size=n_keys * n_rows)
    keys = np.repeat(np.arange(n_keys), n_rows)
    y = slopes[keys, side] * x + rng.normal(0, 1.0, size=x.size)
    fitted = fit_per_key(x[:, None], y, keys, 2, random_state=0, global_model=False)
    exact = np.array(
        [_brute_force_min_loss(x[keys == key], y[keys == key]) for key in range(n_keys)]
    )
    ratio = fitted.min_loss / exact
    assert np.all(ratio >= 1 - 1e-9)
    assert np.mean(ratio <= 1.001) >= 0.99
    assert np.all(ratio <= 1.05)


def test_keys_match_the_default_estimator_fitted_on_each_key_alone():
    X, y, account, _ = make_shared_accounts(n_accounts=200, n_ratings=200, random_state=4)
    fitted = fit_per_key(X, y, account, 2, random_state=0, global_model=False)
    assert np.all(fitted.status == STATUSES.index("fitted"))
    for key in range(0, 200, 40):
        rows = account == key
        alone = MixtureOfLinearRegressions(n_components=2, random_state=0).fit(X[rows], y[rows])
        reference = min_loss(y[rows], alone.predict(X[rows]))
        assert fitted.min_loss[key] <= 1.001 * reference
        # The reported min-loss is that of the stored lines.
        own = min_loss(y[rows], fitted.predict(X[rows], account[rows]))
        assert own == pytest.approx(fitted.min_loss[key], rel=1e-9)


def test_noiseless_lines_are_recovered_and_predicted_per_key():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 2))
    keys = np.repeat(["alice", "bob"], 200)
    lines = {
        "alice": ([1.0, -2.0, 0.5], [3.0, 1.0, -4.0]),
        "bob": ([0.0, 4.0, 2.0], [-5.0, 0.0, 1.0]),
    }
    side = np.arange(400) % 2
    coef = np.array([[lines[key][s][:2] for s in (0, 1)] for key in keys])
    intercept = np.array([[lines[key][s][2] for s in (0, 1)] for key in keys])
    y = np.einsum("nd,nd->n", x, coef[np.arange(400), side]) + intercept[np.arange(400), side]
    fitted = fit_per_key(x, y, keys, 2, random_state=1)
    assert list(fitted.keys) == ["alice", "bob"]
    assert np.all(fitted.min_loss < 1e-20)
    for position, key in enumerate(["alice", "bob"]):
        got = sorted(zip(fitted.coef[position].tolist(), fitted.intercept[position], strict=True))
        want = sorted((list(line[:2]), line[2]) for line in lines[key])
        for (g_coef, g_intercept), (w_coef, w_intercept) in zip(got, want, strict=True):
            np.testing.assert_allclose(g_coef, w_coef, atol=1e-8)
            assert g_intercept == pytest.approx(w_intercept, abs=1e-8)
        np.testing.assert_allclose(fitted.shares[position], [0.5, 0.5])
    new_x = np.array([[1.0, 1.0], [2.0, 0.0]])
    predicted = fitted.predict(new_x, ["bob", "alice"])
    np.testing.assert_allclose(sorted(predicted[0]), sorted([0 + 4 + 2, -5 + 0 + 1]), atol=1e-8)
    np.testing.assert_allclose(sorted(predicted[1]), sorted([2 + 0.5, 6 - 4]), atol=1e-8)


def test_small_keys_get_one_line_or_are_skipped_and_unknown_keys_as_asked():
    X, y, account, _ = make_shared_accounts(n_accounts=5, n_ratings=100, random_state=2)
    X = np.vstack([X, [[0.1, 0.2, 0.3, 0.4]], np.ones((3, 4))])
    y = np.concatenate([y, [2.5], [1.0, 2.0, 3.0]])
    account = np.concatenate([account, [7], [8, 8, 8]])
    one_line = fit_per_key(X, y, account, 2, random_state=0)
    assert [STATUSES[s] for s in one_line.status] == ["fitted"] * 5 + ["k1", "k1"]
    assert one_line.summary()["keys_by_status"] == {"fitted": 5, "k1": 2, "skipped": 0, "failed": 0}
    # One row: its line passes through it; three identical x: the line gives their mean.
    np.testing.assert_allclose(one_line.predict(X[-4:-3], [7]), [[2.5, 2.5]])
    np.testing.assert_allclose(one_line.predict(np.ones((1, 4)), [8]), [[2.0, 2.0]])
    np.testing.assert_allclose(one_line.shares[-1], [1.0, 0.0])
    skipped = fit_per_key(X, y, account, 2, random_state=0, small_keys="skip")
    assert skipped.summary()["keys_by_status"]["skipped"] == 2
    assert np.isnan(skipped.min_loss[-1])
    np.testing.assert_allclose(
        skipped.predict(np.ones((1, 4)), [8]), skipped.global_model.predict(np.ones((1, 4)))
    )
    with pytest.raises(UnknownKeyError, match="8"):
        skipped.predict(np.ones((1, 4)), [8], unknown="error")
    np.testing.assert_allclose(
        one_line.predict(X[:2], [99, 0])[0], one_line.global_model.predict(X[:1])[0]
    )


def test_a_key_with_a_nan_fails_alone_and_rows_without_a_key_are_counted():
    X, y, account, _ = make_shared_accounts(n_accounts=4, n_ratings=60, random_state=5)
    X[np.flatnonzero(account == 2)[3], 1] = np.nan
    keys = account.astype(np.float64)
    keys[:5] = np.nan
    fitted = fit_per_key(X, y, keys, 2, random_state=0)
    assert STATUSES[fitted.status[2]] == "failed"
    assert fitted.failures == {"2": "a feature or the target is not a finite number"}
    assert [STATUSES[s] for s in np.delete(fitted.status, 2)] == ["fitted"] * 3
    assert fitted.rows_without_key == 5
    assert fitted.n_rows.sum() == 4 * 60 - 5
    assert np.all(np.isfinite(fitted.global_model.coef_))
    with pytest.raises(ValueError, match="non-integer"):
        fit_per_key(X, y, np.full(y.size, 0.5), 2)


def test_a_hundred_thousand_keys_of_one_row_take_the_fast_path():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100_000, 4))
    y = rng.standard_normal(100_000)
    keys = rng.permutation(100_000)
    started = time.perf_counter()
    fitted = fit_per_key(X, y, keys, 2, random_state=0, global_model=False)
    seconds = time.perf_counter() - started
    assert fitted.summary()["keys_by_status"]["k1"] == 100_000
    # Each one-row key's line passes through its row.
    np.testing.assert_allclose(fitted.predict(X, keys), np.column_stack([y, y]), atol=1e-8)
    skipped = fit_per_key(X, y, keys, 2, small_keys="skip", global_model=False)
    assert skipped.summary()["keys_by_status"]["skipped"] == 100_000
    assert seconds < 30


def test_the_same_seed_gives_the_same_fit_and_batches_do_not_matter(monkeypatch):
    X, y, account, _ = make_shared_accounts(n_accounts=30, n_ratings=80, random_state=6)
    first = fit_per_key(X, y, account, 2, random_state=11, global_model=False)
    second = fit_per_key(X, y, account, 2, random_state=11, global_model=False)
    for name in ("coef", "intercept", "shares", "min_loss"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    progress: list[tuple[int, int]] = []
    monkeypatch.setattr("mixreg._keyed.BATCH_ELEMENTS", 80 * 40)
    batched = fit_per_key(
        X,
        y,
        account,
        2,
        random_state=11,
        global_model=False,
        progress=lambda *a: progress.append(a),
    )
    assert len(progress) > 1 and progress[-1] == (30, 30)
    np.testing.assert_allclose(batched.min_loss, first.min_loss, rtol=1e-3)
