"""Datasets read as row chunks: the sources a streamed fit passes over.

A streamed fit (:mod:`mixreg._streamed`) never holds its rows at once. Every step after the
search is a sum over rows, so each runs as one *pass*: a function applied to every chunk, its
per-chunk results combined in chunk order. A source says how many rows and chunks it has and
reads one chunk; :meth:`ChunkSource.map` runs a pass's function over every chunk, here one
after the other in this process (a Dask source, :mod:`mixreg._dask`, runs them as tasks on
a cluster, each task reading its own chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Chunk:
    """Consecutive rows of a dataset: features, targets and (optional) positive weights."""

    X: FloatArray
    """Shape (n_rows, n_features)."""
    y: FloatArray
    """Shape (n_rows,)."""
    sample_weight: FloatArray | None = None
    """Shape (n_rows,), or None when every row weighs 1."""
    index: int = 0
    """The chunk's position in its source."""

    @property
    def n_rows(self) -> int:
        return int(self.y.shape[0])


@runtime_checkable
class ChunkSource(Protocol):
    """Rows of a dataset in consecutive chunks, read one at a time."""

    @property
    def n_rows(self) -> int:
        """Rows of all chunks."""

    @property
    def n_features(self) -> int: ...

    @property
    def chunk_rows(self) -> Sequence[int]:
        """Rows of each chunk, in order (known without reading them)."""

    @property
    def has_weights(self) -> bool: ...

    def read(self, index: int) -> Chunk:
        """Chunk ``index`` (0-based)."""

    def map(self, function: Callable[..., Any], *args: Any) -> Iterator[Any]:
        """``function(chunk, *args)`` of every chunk, in chunk order."""


class _ReadInOrder:
    """:meth:`ChunkSource.map` in this process: one chunk read and released at a time."""

    def map(self, function: Callable[..., Any], *args: Any) -> Iterator[Any]:
        for index in range(len(self.chunk_rows)):  # type: ignore[attr-defined]
            yield function(self.read(index), *args)  # type: ignore[attr-defined]


class _CountedChunks:
    """The sizes of a source that counted its chunks' rows up front (``_rows``,
    ``_n_features``, ``_has_weights``, set by the subclass)."""

    _rows: list[int]
    _n_features: int
    _has_weights: bool

    @property
    def n_rows(self) -> int:
        return int(sum(self._rows))

    @property
    def n_features(self) -> int:
        return self._n_features

    @property
    def chunk_rows(self) -> list[int]:
        return list(self._rows)

    @property
    def has_weights(self) -> bool:
        return self._has_weights


def _checked_chunk(
    X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None, where: str
) -> Chunk:
    """A chunk of finite float64 values, or ValueError naming ``where`` and what is wrong."""
    X_arr = np.asarray(X, dtype=np.float64)
    y_arr = np.asarray(y, dtype=np.float64).reshape(-1)
    if X_arr.ndim != 2 or X_arr.shape[0] != y_arr.shape[0]:
        raise ValueError(
            f"{where}: X must be (n_rows, n_features) and y (n_rows,); got {X_arr.shape} and "
            f"{y_arr.shape}"
        )
    for name, values in (("X", X_arr), ("y", y_arr)):
        if not np.isfinite(values).all():
            raise ValueError(f"{where}: {name} holds NaN or infinite values")
    weights = None
    if sample_weight is not None:
        weights = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
        if weights.shape != y_arr.shape:
            raise ValueError(
                f"{where}: sample_weight has {weights.size} values for {y_arr.size} rows"
            )
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"{where}: sample_weight must be finite and non-negative")
    return Chunk(X_arr, y_arr, weights)


class ArrayChunks(_ReadInOrder):
    """Arrays in memory read as row chunks of ``chunk_size`` rows (the last may be shorter).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    sample_weight : array-like of shape (n_samples,), optional
    chunk_size : int
    """

    def __init__(
        self,
        X: ArrayLike,
        y: ArrayLike,
        sample_weight: ArrayLike | None = None,
        *,
        chunk_size: int = 1 << 16,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive number of rows; got {chunk_size}")
        checked = _checked_chunk(X, y, sample_weight, "ArrayChunks")
        self._chunk = checked
        self._chunk_size = int(chunk_size)
        n_rows = checked.n_rows
        self._bounds = [*list(range(0, n_rows, self._chunk_size)), n_rows]

    @property
    def n_rows(self) -> int:
        return self._chunk.n_rows

    @property
    def n_features(self) -> int:
        return int(self._chunk.X.shape[1])

    @property
    def chunk_rows(self) -> list[int]:
        return [stop - start for start, stop in zip(self._bounds, self._bounds[1:], strict=False)]

    @property
    def has_weights(self) -> bool:
        return self._chunk.sample_weight is not None

    def read(self, index: int) -> Chunk:
        rows = slice(self._bounds[index], self._bounds[index + 1])
        weights = self._chunk.sample_weight
        return Chunk(
            self._chunk.X[rows],
            self._chunk.y[rows],
            None if weights is None else weights[rows],
            index,
        )


class NpyChunks(_CountedChunks, _ReadInOrder):
    """Row chunks stored as ``.npy`` files in a directory, read memory-mapped.

    Chunk ``i`` is ``X_{i}.npy`` (n_rows, n_features), ``y_{i}.npy`` and, when the dataset has
    weights, ``w_{i}.npy``, numbered from 0 with no gap (:func:`write_npy_chunks` writes them).
    Only the headers are read up front; a pass reads one chunk at a time, so a source can be
    pickled to a worker process that then reads its chunks from the same directory.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        rows: list[int] = []
        n_features: int | None = None
        while (self.directory / f"X_{len(rows)}.npy").exists():
            shape = np.load(self.directory / f"X_{len(rows)}.npy", mmap_mode="r").shape
            if len(shape) != 2 or (n_features is not None and shape[1] != n_features):
                raise ValueError(
                    f"{self.directory}: X_{len(rows)}.npy has shape {shape}; every chunk needs "
                    f"the same {n_features} columns"
                )
            n_features = int(shape[1])
            rows.append(int(shape[0]))
        if not rows or n_features is None:
            raise ValueError(f"{self.directory} holds no X_0.npy: no row chunks to read")
        self._rows = rows
        self._n_features = n_features
        self._has_weights = (self.directory / "w_0.npy").exists()

    def read(self, index: int) -> Chunk:
        def load(name: str) -> FloatArray:
            array: FloatArray = np.load(self.directory / f"{name}_{index}.npy", mmap_mode="r")
            return array

        weights = load("w") if self._has_weights else None
        chunk = _checked_chunk(load("X"), load("y"), weights, f"{self.directory} chunk {index}")
        return Chunk(chunk.X, chunk.y, chunk.sample_weight, index)


def write_npy_chunks(
    directory: str | Path,
    chunks: Iterator[tuple[FloatArray, FloatArray]] | Sequence[tuple[FloatArray, FloatArray]],
) -> NpyChunks:
    """Write ``(X, y)`` pairs as the row chunks of :class:`NpyChunks` and open them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for index, (X, y) in enumerate(chunks):
        np.save(directory / f"X_{index}.npy", np.ascontiguousarray(X, dtype=np.float64))
        np.save(directory / f"y_{index}.npy", np.ascontiguousarray(y, dtype=np.float64))
    return NpyChunks(directory)
