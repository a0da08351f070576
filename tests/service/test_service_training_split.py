"""A fit reads its dataset block by block straight into the training and holdout rows: the
same rows, in the same order, as splitting the whole matrix."""

from __future__ import annotations

import numpy as np
import pytest

from service.jobs.fit_spec import FitSpec, TrainHoldout


def spec(holdout_fraction: float, seed: int) -> FitSpec:
    return FitSpec(
        algorithm="am",
        n_components=2,
        params={},
        fit_intercept=True,
        holdout_fraction=holdout_fraction,
        seed=seed,
        time_budget_s=None,
    )


@pytest.mark.parametrize(("holdout_fraction", "seed"), [(0.2, 0), (0.0, 1), (0.9, 7), (0.5, 3)])
@pytest.mark.parametrize("block_rows", [1, 7, 64, 1000])
def test_split_read_in_blocks_equals_the_split_of_the_whole(holdout_fraction, seed, block_rows):
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((333, 4)), rng.standard_normal(333)
    blocks = (
        (X[at : at + block_rows], y[at : at + block_rows]) for at in range(0, 333, block_rows)
    )
    whole = TrainHoldout.of_arrays(X, y, spec(holdout_fraction, seed))
    streamed = TrainHoldout.of_blocks(
        blocks, n_rows=333, n_features=4, spec=spec(holdout_fraction, seed)
    )
    for name in ("X_train", "y_train", "X_holdout", "y_holdout"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(whole, name))
    assert len(whole.y_holdout) == round(holdout_fraction * 333)


def test_a_dataset_whose_blocks_end_early_is_refused():
    blocks = iter([(np.ones((5, 2)), np.ones(5))])
    with pytest.raises(ValueError, match="has 6 rows but 5 were read"):
        TrainHoldout.of_blocks(blocks, n_rows=6, n_features=2, spec=spec(0.2, 0))


@pytest.mark.parametrize(("holdout_fraction", "seed"), [(0.2, 0), (0.5, 3), (0.9, 7), (0.0, 1)])
def test_a_grouped_split_keeps_every_group_whole_on_one_side(holdout_fraction, seed):
    rng = np.random.default_rng(seed)
    groups = rng.choice([f"g{i}" for i in range(40)], size=500).astype(object)
    X, y = rng.standard_normal((500, 2)), rng.standard_normal(500)
    weights = rng.uniform(0.5, 2.0, size=500)
    whole = TrainHoldout.of_arrays(
        X, y, spec(holdout_fraction, seed), weights=weights, groups=groups
    )
    streamed = TrainHoldout.of_blocks(
        ((X[at : at + 64], y[at : at + 64]) for at in range(0, 500, 64)),
        n_rows=500,
        n_features=2,
        spec=spec(holdout_fraction, seed),
        weights=weights,
        groups=groups,
    )
    assert whole.groups_train is not None and whole.groups_holdout is not None
    assert not set(whole.groups_train) & set(whole.groups_holdout)
    assert set(whole.groups_train) | set(whole.groups_holdout) == set(groups)
    # The holdout takes whole groups while they fit in its share of the rows (one at least).
    assert len(whole.y_holdout) <= round(holdout_fraction * 500) or (
        len(set(whole.groups_holdout)) == 1
    )
    if holdout_fraction == 0.0:
        assert len(whole.y_holdout) == 0
    else:
        assert len(whole.y_holdout) > 0
    for name in (
        "X_train",
        "y_train",
        "X_holdout",
        "y_holdout",
        "weights_train",
        "weights_holdout",
        "groups_train",
        "groups_holdout",
    ):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(whole, name))
    # Rows keep their weight and group on either side.
    rows = {tuple(row): (w, g) for row, w, g in zip(X.tolist(), weights, groups, strict=True)}
    holdout = zip(
        whole.X_holdout.tolist(), whole.weights_holdout, whole.groups_holdout, strict=True
    )
    for row, w, g in holdout:
        assert rows[tuple(row)] == (w, g)
