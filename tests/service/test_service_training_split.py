"""A fit reads its dataset block by block straight into the training and holdout rows: the
same rows, in the same order, as splitting the whole matrix."""

from __future__ import annotations

import numpy as np
import pytest

from service.jobs.training import FitSpec, TrainHoldout


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
