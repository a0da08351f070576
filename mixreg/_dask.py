"""The passes of a streamed fit as tasks on a ``dask.distributed`` cluster.

A pass of :mod:`mixreg._streamed` is a function of one chunk whose results are combined in
chunk order. Here each chunk's call is one task (``Client.submit``), run where the chunk is:

- :class:`DaskChunks` wraps a source whose chunks every worker can read itself (a directory
  of ``.npy`` chunks on a shared disk; in the service, the database): the task is sent the
  source's description and the chunk's index, reads the chunk and returns the pass's sums,
  so the rows never go through the scheduler or the fitting process;
- :class:`DaskArrayChunks` takes dask arrays (or a DataFrame) as ``xgboost.dask`` and dask-ml
  do: each row block becomes a chunk held by the cluster, and each task runs where its block
  is.

Only the per-chunk sums, ``O(k (p + 1)^2)`` per start, come back; the fitting process combines
them in chunk order, so the lines are those of the embedded streamed fit bit for bit. A task
lost with its worker is run again by the scheduler elsewhere (Dask's own retries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ._chunks import Chunk, ChunkSource, _checked_chunk, _CountedChunks


def _on_chunk(source: ChunkSource, index: int, function: Callable[..., Any], *args: Any) -> Any:
    """A task: read chunk ``index`` of ``source`` on the worker and apply a pass to it."""
    return function(source.read(index), *args)


def _applied(chunk: Chunk, function: Callable[..., Any], *args: Any) -> Any:
    return function(chunk, *args)


def _default_client(client: Any) -> Any:
    if client is not None:
        return client
    from distributed import get_client

    try:
        return get_client()
    except ValueError as error:
        raise ValueError(
            "client: no dask.distributed Client is running; start one "
            "(distributed.Client(...)) or pass client="
        ) from error


class DaskChunks:
    """A source's passes run on a cluster, each task reading its own chunk.

    Parameters
    ----------
    source : ChunkSource
        Picklable, and readable from every worker (e.g. :class:`~mixreg.NpyChunks` on a disk
        the workers share).
    client : distributed.Client, optional
        The default client when None.
    """

    def __init__(self, source: ChunkSource, client: Any = None) -> None:
        self.source = source
        self.client = _default_client(client)

    @property
    def n_rows(self) -> int:
        return self.source.n_rows

    @property
    def n_features(self) -> int:
        return self.source.n_features

    @property
    def chunk_rows(self) -> list[int]:
        return list(self.source.chunk_rows)

    @property
    def has_weights(self) -> bool:
        return self.source.has_weights

    def read(self, index: int) -> Chunk:
        return self.source.read(index)

    def map(self, function: Callable[..., Any], *args: Any) -> Iterator[Any]:
        futures = [
            self.client.submit(_on_chunk, self.source, index, function, *args, pure=False)
            for index in range(len(self.source.chunk_rows))
        ]
        yield from self.client.gather(futures)


def _block_chunk(X: Any, y: Any, weights: Any, index: int) -> Chunk:
    checked = _checked_chunk(X, y, weights, f"dask block {index}")
    return Chunk(checked.X, checked.y, checked.sample_weight, index)


class DaskArrayChunks(_CountedChunks):
    """Dask arrays (or a DataFrame) as row chunks held by the cluster: one per row block.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features), or dask DataFrame
    y : dask array or Series of shape (n_samples,)
    sample_weight : dask array or Series of shape (n_samples,), optional
    client : distributed.Client, optional
        The default client when None.
    """

    def __init__(self, X: Any, y: Any, sample_weight: Any = None, client: Any = None) -> None:
        import dask.array as da
        from dask.delayed import delayed

        if y is None:
            raise ValueError("y: a fit on dask arrays needs y as a dask array of the same rows")

        def as_array(values: Any, name: str) -> Any:
            if isinstance(values, np.ndarray):
                values = da.from_array(values)  # type: ignore[no-untyped-call]
            if not isinstance(values, da.Array):
                if not hasattr(values, "to_dask_array"):
                    raise ValueError(f"{name}: expected a dask array or DataFrame")
                values = values.to_dask_array(lengths=True)
            return values.astype(np.float64)

        X_arr = as_array(X, "X")
        if X_arr.ndim != 2:
            raise ValueError(f"X must be 2-dimensional (n_samples, n_features); got {X_arr.shape}")
        # Whole rows in each block: the passes need every feature of a row.
        X_arr = X_arr.rechunk({1: -1})
        row_chunks = X_arr.chunks[0]
        columns = [as_array(y, "y").reshape(-1)]
        if sample_weight is not None:
            columns.append(as_array(sample_weight, "sample_weight").reshape(-1))
        for name, column in zip(("y", "sample_weight"), columns, strict=False):
            if column.shape[0] != X_arr.shape[0]:
                raise ValueError(f"{name} has {column.shape[0]} rows but X has {X_arr.shape[0]}")
        columns = [column.rechunk({0: row_chunks}) for column in columns]
        self.client = _default_client(client)
        blocks = [X_arr.to_delayed().ravel(), *(column.to_delayed().ravel() for column in columns)]
        make = delayed(_block_chunk, pure=True)
        chunks = [
            make(
                blocks[0][index],
                blocks[1][index],
                blocks[2][index] if len(blocks) > 2 else None,
                index,
            )
            for index in range(len(row_chunks))
        ]
        self._chunks = self.client.compute(chunks)
        self._rows = [int(rows) for rows in row_chunks]
        self._n_features = int(X_arr.shape[1])
        self._has_weights = sample_weight is not None

    def read(self, index: int) -> Chunk:
        chunk: Chunk = self._chunks[index].result()
        return chunk

    def map(self, function: Callable[..., Any], *args: Any) -> Iterator[Any]:
        futures = [
            self.client.submit(_applied, chunk, function, *args, pure=False)
            for chunk in self._chunks
        ]
        yield from self.client.gather(futures)
