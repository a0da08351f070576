"""Data generators of the paper's experiments, for tests, examples and benchmarks.

Every generator takes ``random_state`` (``None``, an ``int`` or a :class:`numpy.random.Generator`)
and draws everything from one :class:`numpy.random.Generator`; the integer seeds handed to
scikit-learn's generators are drawn from it, so one seed fixes the whole data set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import make_friedman1, make_friedman2, make_friedman3, make_regression

__all__ = [
    "GatedMixture",
    "make_friedman",
    "make_gated",
    "make_realizable",
    "make_shared_accounts",
    "make_two_regressions",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
RandomState = int | np.random.Generator | None

_FRIEDMAN_1_FEATURES = 5
_FRIEDMAN_2_3_FEATURES = 4
_MAX_SEPARATION_DRAWS = 1000


def _sklearn_seed(rng: np.random.Generator) -> int:
    """Draw an integer seed in scikit-learn's accepted range from ``rng``."""
    return int(rng.integers(0, 2**32 - 1))


def _check_positive_int(value: int, name: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


def _check_non_negative(value: float, name: str) -> None:
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")


def make_friedman(
    variant: int,
    n_train: int = 3200,
    n_test: int = 800,
    noise: float = 4.0,
    n_features: int | None = None,
    random_state: RandomState = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Friedman regression problem 1, 2 or 3, split into a training and a test set.

    These are the paper's non-linear, non-realizable data sets A, B and C. With the defaults
    (3200 training rows, 800 test rows, noise 4.0, 5 features for Friedman 1) the one-line
    least-squares baseline lands near the paper's reported train/test errors.

    Parameters
    ----------
    variant : {1, 2, 3}
        Which of :func:`sklearn.datasets.make_friedman1`, ``make_friedman2`` or
        ``make_friedman3`` generates the rows.
    n_train : int, default=3200
        Number of training rows.
    n_test : int, default=800
        Number of test rows.
    noise : float, default=4.0
        Standard deviation of the Gaussian noise added to the target.
    n_features : int or None, default=None
        Number of features of Friedman 1 (at least 5; only the first 5 matter); ``None``
        means 5. Friedman 2 and 3 always have 4 features and accept only ``None`` or 4.
    random_state : None, int or numpy.random.Generator, default=None
        Source of randomness; an ``int`` makes the output reproducible.

    Returns
    -------
    X_train : ndarray of shape (n_train, n_features)
    y_train : ndarray of shape (n_train,)
    X_test : ndarray of shape (n_test, n_features)
    y_test : ndarray of shape (n_test,)

    Raises
    ------
    ValueError
        If ``variant`` is not 1, 2 or 3, or a size, the noise or ``n_features`` is invalid.
    """
    if variant not in (1, 2, 3):
        raise ValueError(f"variant must be 1, 2 or 3 (Friedman problem number), got {variant!r}.")
    _check_positive_int(n_train, "n_train")
    _check_positive_int(n_test, "n_test")
    _check_non_negative(noise, "noise")
    if variant == 1:
        n_features = _FRIEDMAN_1_FEATURES if n_features is None else n_features
        _check_positive_int(n_features, "n_features", minimum=_FRIEDMAN_1_FEATURES)
    elif n_features not in (None, _FRIEDMAN_2_3_FEATURES):
        raise ValueError(
            f"Friedman {variant} always has {_FRIEDMAN_2_3_FEATURES} features; "
            f"leave n_features=None (got {n_features!r})."
        )
    rng = np.random.default_rng(random_state)
    n_samples = n_train + n_test
    seed = _sklearn_seed(rng)
    if variant == 1:
        X, y = make_friedman1(n_samples, n_features=n_features, noise=noise, random_state=seed)
    elif variant == 2:
        X, y = make_friedman2(n_samples, noise=noise, random_state=seed)
    else:
        X, y = make_friedman3(n_samples, noise=noise, random_state=seed)
    # Rows are drawn i.i.d., so the first n_train rows are as random a split as any.
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def make_two_regressions(
    n_train: int = 3200,
    n_test: int = 800,
    n_features: int = 4,
    noise: float = 4.0,
    biases: tuple[float, float] = (100.0, 0.0),
    random_state: RandomState = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray, IntArray]:
    """Mixture of two noisy linear data sets, as in the paper's appendix.

    Two :func:`sklearn.datasets.make_regression` sets of equal size (each with its own random
    coefficients and its own bias) are stacked, shuffled and split. The source of every row
    is returned too, so an oracle can fit each source separately.

    Parameters
    ----------
    n_train : int, default=3200
        Number of training rows.
    n_test : int, default=800
        Number of test rows. Each source contributes ``(n_train + n_test) / 2`` rows (the
        first source one more when the total is odd).
    n_features : int, default=4
        Number of features; all of them are informative.
    noise : float, default=4.0
        Standard deviation of the Gaussian noise of each source.
    biases : tuple of two floats, default=(100.0, 0.0)
        Intercept of source 0 and of source 1.
    random_state : None, int or numpy.random.Generator, default=None
        Source of randomness; an ``int`` makes the output reproducible.

    Returns
    -------
    X_train : ndarray of shape (n_train, n_features)
    y_train : ndarray of shape (n_train,)
    X_test : ndarray of shape (n_test, n_features)
    y_test : ndarray of shape (n_test,)
    source_train : ndarray of shape (n_train,)
        0 or 1: the source each training row was drawn from.
    source_test : ndarray of shape (n_test,)
        0 or 1: the source each test row was drawn from.

    Raises
    ------
    ValueError
        If a size, the noise or ``biases`` is invalid.
    """
    _check_positive_int(n_train, "n_train")
    _check_positive_int(n_test, "n_test")
    _check_positive_int(n_features, "n_features")
    _check_non_negative(noise, "noise")
    if len(biases) != 2 or not np.all(np.isfinite(biases)):
        raise ValueError(f"biases must be two finite numbers, got {biases!r}.")
    rng = np.random.default_rng(random_state)
    n_samples = n_train + n_test
    source_sizes = (n_samples - n_samples // 2, n_samples // 2)
    blocks = [
        make_regression(
            n_samples=size,
            n_features=n_features,
            n_informative=n_features,
            noise=noise,
            bias=bias,
            random_state=_sklearn_seed(rng),
        )
        for size, bias in zip(source_sizes, biases, strict=True)
    ]
    X = np.concatenate([block[0] for block in blocks])
    y = np.concatenate([block[1] for block in blocks])
    source = np.repeat(np.arange(2, dtype=np.int64), source_sizes)
    order = rng.permutation(n_samples)
    X, y, source = X[order], y[order], source[order]
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:], source[:n_train], source[n_train:]


def make_realizable(
    n_samples: int = 1000,
    n_features: int = 2,
    n_components: int = 2,
    noise: float = 0.1,
    fit_intercept: bool = True,
    random_state: RandomState = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, IntArray]:
    """Rows drawn from k well-separated lines: the realizable setting, for tests.

    Features are standard normal. Every row belongs to one line (the labels are balanced:
    shares differ by at most one row) and its target is that line's value plus Gaussian noise.
    Coefficients and intercepts are drawn from a normal distribution with standard deviation
    3 and redrawn until every two lines differ by at least 2 in Euclidean norm of
    (coefficients, intercept), so that the lines are distinguishable far above a small noise.

    Parameters
    ----------
    n_samples : int, default=1000
        Number of rows.
    n_features : int, default=2
        Number of features d.
    n_components : int, default=2
        Number of lines k.
    noise : float, default=0.1
        Standard deviation of the Gaussian noise added to every target.
    fit_intercept : bool, default=True
        Whether the lines have intercepts; if False all intercepts are 0.
    random_state : None, int or numpy.random.Generator, default=None
        Source of randomness; an ``int`` makes the output reproducible.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    coef : ndarray of shape (n_components, n_features)
        The true coefficients of each line.
    intercept : ndarray of shape (n_components,)
        The true intercepts (zeros when ``fit_intercept`` is False).
    labels : ndarray of shape (n_samples,)
        The line each row was drawn from.

    Raises
    ------
    ValueError
        If a size or the noise is invalid, or no well-separated set of lines was found
        (too many lines in too few dimensions).
    """
    _check_positive_int(n_samples, "n_samples")
    _check_positive_int(n_features, "n_features")
    _check_positive_int(n_components, "n_components")
    _check_non_negative(noise, "noise")
    rng = np.random.default_rng(random_state)
    coef, intercept = _draw_separated_lines(rng, n_features, n_components, fit_intercept)
    X = rng.standard_normal((n_samples, n_features))
    labels = rng.permutation(np.arange(n_samples, dtype=np.int64) % n_components)
    # One (n, k) product instead of gathering an (n, d) block of per-row coefficients.
    line_values = X @ coef.T + intercept
    y = line_values[np.arange(n_samples), labels] + noise * rng.standard_normal(n_samples)
    return X, y, coef, intercept, labels


@dataclass(frozen=True)
class GatedMixture:
    """Rows drawn from a gated mixture of lines, with the truth they were drawn from."""

    X: FloatArray
    """Features, shape (n_samples, n_features)."""
    y: FloatArray
    """Targets, shape (n_samples,)."""
    concomitant: FloatArray
    """The columns the gate reads, shape (n_samples, q): X itself when the gate reads the
    features."""
    coef: FloatArray
    """The lines' coefficients, shape (n_components, n_features)."""
    intercept: FloatArray
    """The lines' intercepts, shape (n_components,)."""
    gate_coef: FloatArray
    """The gate's slopes, shape (n_components, q); the first row (the reference) is zero."""
    gate_intercept: FloatArray
    """The gate's intercepts, shape (n_components,); the first is zero."""
    labels: IntArray
    """The line each row was drawn from, shape (n_samples,)."""

    def probabilities(self) -> FloatArray:
        """The true mixing probabilities of every row, shape (n_samples, n_components)."""
        logits = self.concomitant @ self.gate_coef.T + self.gate_intercept
        logits -= logits.max(axis=1, keepdims=True)
        weights = np.exp(logits)
        probabilities: FloatArray = weights / weights.sum(axis=1, keepdims=True)
        return probabilities


def make_gated(
    n_samples: int = 1000,
    n_features: int = 2,
    n_components: int = 2,
    n_concomitant: int | None = None,
    gate_scale: float = 1.5,
    noise: float = 0.1,
    random_state: RandomState = None,
) -> GatedMixture:
    """Rows drawn from a gated mixture: the line of a row depends on its concomitant columns.

    Lines are drawn as in :func:`make_realizable`; the gate's slopes are normal with standard
    deviation ``gate_scale`` and its intercepts normal with standard deviation 0.5, the first
    component's both zero (the reference). Each row's line is drawn from the softmax of its
    logits (by the Gumbel-max trick, all rows at once), and its target is that line's value
    plus Gaussian noise. Features and concomitant columns are standard normal.

    Parameters
    ----------
    n_samples, n_features, n_components : int
    n_concomitant : int, optional
        Columns of the gate, drawn apart from the features; by default the gate reads the
        features.
    gate_scale : float, default=1.5
    noise : float, default=0.1
    random_state : None, int or numpy.random.Generator, default=None

    Returns
    -------
    GatedMixture
    """
    _check_positive_int(n_samples, "n_samples")
    _check_positive_int(n_features, "n_features")
    _check_positive_int(n_components, "n_components")
    if n_concomitant is not None:
        _check_positive_int(n_concomitant, "n_concomitant")
    _check_non_negative(gate_scale, "gate_scale")
    _check_non_negative(noise, "noise")
    rng = np.random.default_rng(random_state)
    coef, intercept = _draw_separated_lines(rng, n_features, n_components, True)
    X = rng.standard_normal((n_samples, n_features))
    concomitant = X if n_concomitant is None else rng.standard_normal((n_samples, n_concomitant))
    gate_coef = gate_scale * rng.standard_normal((n_components, concomitant.shape[1]))
    gate_intercept = 0.5 * rng.standard_normal(n_components)
    gate_coef[0], gate_intercept[0] = 0.0, 0.0
    logits = concomitant @ gate_coef.T + gate_intercept
    labels = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1).astype(np.int64)
    line_values = X @ coef.T + intercept
    y = line_values[np.arange(n_samples), labels] + noise * rng.standard_normal(n_samples)
    return GatedMixture(
        X=X,
        y=y,
        concomitant=concomitant,
        coef=coef,
        intercept=intercept,
        gate_coef=gate_coef,
        gate_intercept=gate_intercept,
        labels=labels,
    )


def _draw_separated_lines(
    rng: np.random.Generator, n_features: int, n_components: int, fit_intercept: bool
) -> tuple[FloatArray, FloatArray]:
    """Draw k lines whose (coefficients, intercept) vectors are pairwise at least 2 apart."""
    scale, min_distance = 3.0, 2.0
    for _ in range(_MAX_SEPARATION_DRAWS):
        coef = scale * rng.standard_normal((n_components, n_features))
        intercept = (
            scale * rng.standard_normal(n_components) if fit_intercept else np.zeros(n_components)
        )
        params = np.column_stack([coef, intercept])
        distances = np.linalg.norm(params[:, None, :] - params[None, :, :], axis=-1)
        off_diagonal = distances[~np.eye(n_components, dtype=bool)]
        if off_diagonal.size == 0 or off_diagonal.min() >= min_distance:
            return coef, intercept
    raise ValueError(
        f"could not draw {n_components} lines at least {min_distance} apart in "
        f"{n_features + int(fit_intercept)} parameters; use fewer components or more features."
    )


def make_shared_accounts(
    n_accounts: int = 100,
    n_ratings: int = 200,
    n_features: int = 4,
    people: tuple[int, int] = (2, 3),
    n_items: int = 2000,
    noise: float = 0.3,
    random_state: RandomState = None,
) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """Ratings of shared accounts: each account's rows come from 2 to 3 people of distinct tastes.

    As in the paper's MovieLens experiment, an item is an embedding vector and a person's
    rating of it is a line of the embedding (the person's taste and bias) plus noise; an
    account mixes the ratings of a few people, so a mixture of lines fitted to the account
    recovers its people's tastes. Item embeddings are standard normal; every person's taste
    is standard normal scaled by 2 and bias uniform in [2, 4]; the tastes within an account
    are redrawn until every two are at least 2 apart (separated tastes). Every rating is by a
    person of the account drawn uniformly.

    Parameters
    ----------
    n_accounts : int, default=100
    n_ratings : int, default=200
        Ratings (rows) per account.
    n_features : int, default=4
        Dimension d of the item embeddings.
    people : tuple of two ints, default=(2, 3)
        Fewest and most people per account (each account draws its number uniformly).
    n_items : int, default=2000
        Items in the catalog the ratings are drawn from.
    noise : float, default=0.3
        Standard deviation of the Gaussian noise of every rating.
    random_state : None, int or numpy.random.Generator, default=None

    Returns
    -------
    X : ndarray of shape (n_accounts * n_ratings, n_features)
        The rated item's embedding.
    y : ndarray of shape (n_accounts * n_ratings,)
        The rating.
    account : ndarray of shape (n_accounts * n_ratings,)
        The account of each row (0 to n_accounts - 1); rows are shuffled across accounts.
    person : ndarray of shape (n_accounts * n_ratings,)
        Which of the account's people gave the rating (0 to people[1] - 1).

    Raises
    ------
    ValueError
        If a size, ``people`` or the noise is invalid.
    """
    _check_positive_int(n_accounts, "n_accounts")
    _check_positive_int(n_ratings, "n_ratings")
    _check_positive_int(n_features, "n_features")
    _check_positive_int(n_items, "n_items")
    _check_non_negative(noise, "noise")
    fewest, most = people
    _check_positive_int(fewest, "people[0]")
    _check_positive_int(most, "people[1]", minimum=fewest)
    rng = np.random.default_rng(random_state)
    items = rng.standard_normal((n_items, n_features))
    tastes = 2.0 * rng.standard_normal((n_accounts, most, n_features))
    biases = rng.uniform(2.0, 4.0, size=(n_accounts, most))
    # Redraw, all at once, every account whose people are not pairwise separated.
    for _ in range(_MAX_SEPARATION_DRAWS):
        params = np.concatenate([tastes, biases[:, :, None]], axis=2)
        distances = np.linalg.norm(params[:, :, None] - params[:, None, :], axis=-1)
        distances[:, np.arange(most), np.arange(most)] = np.inf
        close = distances.min(axis=(1, 2)) < 2.0
        if not close.any():
            break
        tastes[close] = 2.0 * rng.standard_normal((int(close.sum()), most, n_features))
        biases[close] = rng.uniform(2.0, 4.0, size=(int(close.sum()), most))
    n_people = rng.integers(fewest, most + 1, size=n_accounts)
    n_rows = n_accounts * n_ratings
    account = np.repeat(np.arange(n_accounts, dtype=np.int64), n_ratings)
    person = (rng.random(n_rows) * n_people[account]).astype(np.int64)
    X = items[rng.integers(0, n_items, size=n_rows)]
    y = (
        np.einsum("nd,nd->n", X, tastes[account, person])
        + biases[account, person]
        + noise * rng.standard_normal(n_rows)
    )
    order = rng.permutation(n_rows)
    return X[order], y[order], account[order], person[order]
