"""The hard cases of the default search: many lines on non-linear data and on 10⁴ to 10⁵ rows.

Every set is built from a seed: Friedman 1/2/3 (scikit-learn's generators through
:func:`mixreg.datasets.make_friedman`), the maximum of random planes, MovieLens 100k ratings
over user and movie embeddings and their residuals after the user and movie means
(:mod:`bench.real_data` builds the ratings and the ALS factorization), and realizable mixtures
(:func:`mixreg.datasets.make_realizable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.real_data import (
    als_factorize,
    ensure_movielens_ratings,
    read_ratings,
    split_train_test,
)
from mixreg.datasets import make_friedman, make_realizable

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class HardSet:
    """A training set, its k, and the true lines when it was drawn from k lines."""

    key: str
    title: str
    X: FloatArray
    y: FloatArray
    n_components: int
    oracle: tuple[FloatArray, FloatArray] | None = None
    """(coef, intercept) of the lines the rows were drawn from (realizable sets only)."""


def friedman(variant: int, n_components: int, seed: int, n_train: int = 48_000) -> HardSet:
    """Friedman ``variant`` with ``n_train`` training rows (noise 4, as the paper's)."""
    X, y, _, _ = make_friedman(variant, n_train=n_train, n_test=1, random_state=seed)
    return HardSet(
        f"friedman{variant}-k{n_components}-s{seed}",
        f"Friedman {variant}",
        X,
        y,
        n_components,
    )


def max_of_planes(
    seed: int,
    n_planes: int = 12,
    n_features: int = 10,
    n_components: int = 6,
    n_rows: int = 48_000,
    noise: float = 0.1,
) -> HardSet:
    """``y = max_j (<a_j, x> + b_j) + noise`` with standard normal ``x``, ``a_j`` and ``b_j``.

    A convex piecewise-linear target with more pieces than lines: no k lines are exact.
    """
    rng = np.random.default_rng(seed)
    slopes = rng.standard_normal((n_planes, n_features))
    offsets = rng.standard_normal(n_planes)
    X = rng.standard_normal((n_rows, n_features))
    y = (X @ slopes.T + offsets).max(axis=1) + noise * rng.standard_normal(n_rows)
    return HardSet(
        f"planes{n_planes}-d{n_features}-k{n_components}-s{seed}",
        f"maximum of {n_planes} random planes",
        X,
        y,
        n_components,
    )


def movielens_users_and_movies(seed: int, n_components: int = 8) -> HardSet:
    """MovieLens 100k: each rating's user and movie embeddings (ALS rank 4 each) as features.

    The ALS factorization uses every rating; ``seed`` seeds the 80/20 split, and the training
    rows (80,000) are the set.
    """
    users, movies, ratings = read_ratings(ensure_movielens_ratings())
    _, user_index = np.unique(users, return_inverse=True)
    _, movie_index = np.unique(movies, return_inverse=True)
    user_factors, movie_factors, _ = als_factorize(user_index, movie_index, ratings)
    X = np.hstack([user_factors[user_index], movie_factors[movie_index]])
    X_train, y_train, _, _ = split_train_test(X, ratings, seed=seed)
    return HardSet(
        f"movielens-users-movies-k{n_components}-s{seed}",
        "MovieLens 100k, user + movie embeddings",
        X_train,
        y_train,
        n_components,
    )


def movielens_residuals(seed: int, n_components: int = 8) -> HardSet:
    """MovieLens 100k as :func:`movielens_users_and_movies`, the target a rating's residual.

    The residual is the rating less its user's and its movie's mean rating (plus the mean of
    all ratings). The raw ratings take five values, so eight lines fit them exactly (five flat
    lines): that set cannot tell a good search from a poor one. The residuals take thousands
    of values, and no k lines fit them.
    """
    users, movies, ratings = read_ratings(ensure_movielens_ratings())
    _, user_index = np.unique(users, return_inverse=True)
    _, movie_index = np.unique(movies, return_inverse=True)
    user_factors, movie_factors, _ = als_factorize(user_index, movie_index, ratings)
    X = np.hstack([user_factors[user_index], movie_factors[movie_index]])
    user_mean = np.bincount(user_index, ratings) / np.bincount(user_index)
    movie_mean = np.bincount(movie_index, ratings) / np.bincount(movie_index)
    residuals = ratings - user_mean[user_index] - movie_mean[movie_index] + ratings.mean()
    X_train, y_train, _, _ = split_train_test(X, residuals, seed=seed)
    return HardSet(
        f"movielens-residuals-k{n_components}-s{seed}",
        "MovieLens 100k, rating less user and movie means, over user + movie embeddings",
        X_train,
        y_train,
        n_components,
    )


def realizable(n_rows: int, n_features: int, n_components: int, seed: int) -> HardSet:
    """Rows drawn from ``n_components`` separated lines with noise 0.1."""
    X, y, coef, intercept, _ = make_realizable(
        n_rows, n_features, n_components, noise=0.1, random_state=seed
    )
    return HardSet(
        f"realizable-n{n_rows}-d{n_features}-k{n_components}-s{seed}",
        "realizable mixture",
        X,
        y,
        n_components,
        (coef, intercept),
    )


HARD_SETS: dict[str, Callable[[int], HardSet]] = {
    "friedman1": lambda seed: friedman(1, 6, seed),
    "friedman2": lambda seed: friedman(2, 5, seed),
    "friedman3": lambda seed: friedman(3, 5, seed),
    "planes": max_of_planes,
    "movielens": movielens_users_and_movies,
    "movielens-residuals": movielens_residuals,
    "realizable-small": lambda seed: realizable(10_000, 50, 10, seed),
    "realizable-large": lambda seed: realizable(100_000, 10, 6, seed),
    "realizable-mid": lambda seed: realizable(50_000, 20, 8, seed),
}
"""Every hard set by name, as a function of its seed."""
