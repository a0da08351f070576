"""Fits streamed over row chunks give the in-memory fit's lines, whatever the chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixreg import ArrayChunks, MixtureOfLinearRegressions, NpyChunks, write_npy_chunks
from mixreg._auto import SEARCH_ROWS


def mixture_rows(
    n_rows: int, n_components: int, n_features: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a realizable mixture: each row on one of ``n_components`` random lines, with
    features far from zero (so the scaling's centring matters)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_features)) * rng.uniform(0.5, 3, n_features) + 10.0
    labels = rng.integers(0, n_components, n_rows)
    coef = rng.normal(size=(n_components, n_features)) * 3
    y = np.einsum("ij,ij->i", X, coef[labels]) + 4.0 * labels + 0.1 * rng.normal(size=n_rows)
    return X, y


def assert_same_fit(
    streamed: MixtureOfLinearRegressions, in_memory: MixtureOfLinearRegressions
) -> None:
    """The same lines, shares and min-loss, to 1e-8 relative, from the same search.

    Finalists that reach the same minimum tie to rounding, so which of them is reported (its
    start, its iterations) may differ: only the trace's end is compared.
    """
    scale = np.abs(in_memory.coef_).max() + np.abs(in_memory.intercept_).max()
    np.testing.assert_allclose(streamed.coef_, in_memory.coef_, rtol=1e-8, atol=1e-8 * scale)
    np.testing.assert_allclose(
        streamed.intercept_, in_memory.intercept_, rtol=1e-8, atol=1e-8 * scale
    )
    np.testing.assert_allclose(streamed.shares_, in_memory.shares_, rtol=1e-8, atol=1e-12)
    assert streamed.train_loss_ == pytest.approx(in_memory.train_loss_, rel=1e-8)
    assert streamed.loss_history_[-1] == pytest.approx(in_memory.loss_history_[-1], rel=1e-8)
    assert streamed.n_candidates_ == in_memory.n_candidates_


@settings(max_examples=10, deadline=None)
@given(
    n_rows=st.integers(60, 500),
    n_components=st.integers(1, 3),
    chunk_size=st.integers(1, 600),
    weighting=st.sampled_from(["none", "integers with zeros", "positive", "equal"]),
    fit_intercept=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_streamed_fit_equals_in_memory_fit_whatever_the_chunks(
    n_rows: int,
    n_components: int,
    chunk_size: int,
    weighting: str,
    fit_intercept: bool,
    seed: int,
) -> None:
    X, y = mixture_rows(n_rows, n_components, 2, seed)
    rng = np.random.default_rng(seed + 1)
    weights = {
        "none": None,
        "integers with zeros": rng.integers(0, 4, n_rows).astype(np.float64),
        "positive": rng.uniform(0.1, 5.0, n_rows),
        "equal": np.full(n_rows, 2.5),
    }[weighting]
    if weights is not None and not (weights > 0).any():
        weights[0] = 1.0
    params = {"n_components": n_components, "random_state": seed, "fit_intercept": fit_intercept}
    in_memory = MixtureOfLinearRegressions(**params).fit(X, y, sample_weight=weights)
    streamed = MixtureOfLinearRegressions(**params).fit(
        ArrayChunks(X, y, weights, chunk_size=chunk_size)
    )
    assert_same_fit(streamed, in_memory)
    np.testing.assert_allclose(streamed.predict(X), in_memory.predict(X), rtol=1e-8, atol=1e-8)


def test_streamed_fit_over_more_rows_than_the_search_sample_equals_in_memory_fit() -> None:
    """The search sample is drawn from the same indices as in memory, gathered chunk by chunk;
    the finalists are polished and refitted exactly over the chunks."""
    n_rows = SEARCH_ROWS + 7_000
    X, y = mixture_rows(n_rows, 3, 3, seed=5)
    weights = np.random.default_rng(6).uniform(0.5, 2.0, n_rows)
    in_memory = MixtureOfLinearRegressions(n_components=3, random_state=2).fit(
        X, y, sample_weight=weights
    )
    streamed = MixtureOfLinearRegressions(n_components=3, random_state=2).fit(
        ArrayChunks(X, y, weights, chunk_size=4_096)
    )
    assert_same_fit(streamed, in_memory)
    assert streamed.candidates_[-1]["n_rows"] == n_rows
    # Four passes of scaling, one to gather the sample, then the polish and the exact refits.
    assert streamed.passes_ > 5


def test_one_line_streamed_is_least_squares_on_all_rows() -> None:
    n_rows = SEARCH_ROWS + 1_000
    X, y = mixture_rows(n_rows, 1, 4, seed=9)
    streamed = MixtureOfLinearRegressions(n_components=1, random_state=0).fit(
        ArrayChunks(X, y, chunk_size=3_000)
    )
    design = np.column_stack([X, np.ones(n_rows)])
    solution = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(streamed.coef_[0], solution[:-1], rtol=1e-9)
    assert streamed.intercept_[0] == pytest.approx(solution[-1], rel=1e-9)
    in_memory = MixtureOfLinearRegressions(n_components=1, random_state=0).fit(X, y)
    assert_same_fit(streamed, in_memory)


def test_memory_mapped_npy_chunks_fit_as_the_arrays(tmp_path) -> None:
    X, y = mixture_rows(900, 2, 2, seed=3)
    source = write_npy_chunks(
        tmp_path, [(X[i : i + 250], y[i : i + 250]) for i in range(0, 900, 250)]
    )
    assert source.chunk_rows == [250, 250, 250, 150]
    assert NpyChunks(tmp_path).n_rows == 900
    from_files = MixtureOfLinearRegressions(n_components=2, random_state=4).fit(source)
    from_arrays = MixtureOfLinearRegressions(n_components=2, random_state=4).fit(
        ArrayChunks(X, y, chunk_size=250)
    )
    np.testing.assert_array_equal(from_files.coef_, from_arrays.coef_)
    np.testing.assert_array_equal(from_files.intercept_, from_arrays.intercept_)


def test_a_bad_value_in_a_chunk_is_named(tmp_path) -> None:
    X, y = mixture_rows(300, 2, 2, seed=1)
    X[250, 1] = np.nan
    source = write_npy_chunks(tmp_path, [(X[:200], y[:200]), (X[200:], y[200:])])
    with pytest.raises(ValueError, match=r"chunk 1: X holds NaN"):
        MixtureOfLinearRegressions(n_components=2).fit(source)


@pytest.mark.parametrize(
    ("params", "fit_kwargs", "message"),
    [
        ({"standard_errors": True}, {}, "standard_errors: a fit streamed"),
        ({"gating": True}, {}, "gating: a fit streamed"),
        ({"algorithm": "em"}, {}, "algorithm: a fit streamed over row chunks runs"),
        ({}, {"groups": np.arange(100) // 2}, "groups: a fit streamed"),
        ({}, {"y": np.zeros(100)}, "y: a fit on row chunks reads y from the chunks"),
    ],
)
def test_what_a_streamed_fit_does_not_take_is_refused_by_name(
    params: dict, fit_kwargs: dict, message: str
) -> None:
    X, y = mixture_rows(100, 2, 2, seed=0)
    with pytest.raises(ValueError, match=message):
        MixtureOfLinearRegressions(n_components=2, **params).fit(
            ArrayChunks(X, y, chunk_size=30), **fit_kwargs
        )


def test_every_weight_zero_is_refused() -> None:
    X, y = mixture_rows(50, 2, 2, seed=0)
    with pytest.raises(ValueError, match="sample_weight: every weight is zero"):
        MixtureOfLinearRegressions(n_components=2).fit(ArrayChunks(X, y, np.zeros(50)))


def test_in_memory_fit_without_y_names_y() -> None:
    X, _ = mixture_rows(50, 2, 2, seed=0)
    with pytest.raises(ValueError, match="y: the targets are required"):
        MixtureOfLinearRegressions(n_components=2).fit(X)
