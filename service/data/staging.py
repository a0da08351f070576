"""Staging an upload: its checked rows appended block by block to temporary files.

A reader (:mod:`service.data.readers`) appends each block it has read and checked to a
:class:`StagedDataset`; the dataset is stored only once all of it has been read
(docs/adr/0009-datasets-in-row-chunks.md). Kept (extra) columns go beside the rows to an Arrow
IPC stream, and text that reads as numbers becomes a number column.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.checks import IngestError, check_finite_matrix, check_finite_vector
from service.data.ingest import NO_LIMITS, DatasetLimits, ParsedDataset, check_fittable_scale

FloatArray = NDArray[np.float64]

NUMBER = "number"
STRING = "string"
TEXT = "text"
"""How a kept column arrives: ``number`` and ``string`` are its type already (Parquet, NPZ,
JSON); ``text`` (CSV cells) becomes ``number`` if every value reads as a number."""


class StagedDataset:
    """The checked rows of an upload, appended block by block to temporary files.

    Every block is checked as it arrives (finite, squares that do not overflow, the row limit),
    so when reading ends the whole upload is known to be storable; ``blocks`` then reads it
    back in blocks of any size. Close it (or use it as a context manager) to delete the files.

    ``kept`` maps each kept (extra) column to how it arrives (``NUMBER``, ``STRING`` or
    ``TEXT``); their values go with each block to a temporary Arrow IPC stream, and
    ``with_extras`` reads them back block by block with their inferred types.
    """

    def __init__(
        self,
        *,
        feature_names: list[str],
        target_name: str | None,
        limits: DatasetLimits = NO_LIMITS,
        kept: Mapping[str, str] | None = None,
    ) -> None:
        if not feature_names:
            raise IngestError("the dataset has no feature columns; at least one is required")
        limits.check_features(len(feature_names))
        self.feature_names = feature_names
        self.target_name = target_name
        self.limits = limits
        self.n_rows = 0
        # Rows left out by the missing-value policy ``na="drop"``, per column with the gap.
        self.dropped_rows: dict[str, int] = {}
        self.kept = dict(kept or {})
        clashing = [name for name in self.kept if name in {*feature_names, target_name}]
        if clashing:
            raise IngestError(
                f"keep names '{clashing[0]}', which is "
                f"{'the target' if clashing[0] == target_name else 'a feature'}; a kept column "
                f"is neither"
            )
        # A TEXT column stays a number column while every value read so far is a number.
        self._numeric = {name: arrival != STRING for name, arrival in self.kept.items()}
        self._text_bytes = dict.fromkeys(self.kept, 0)
        # Owned by this object for its lifetime; ``close`` (or leaving ``with``) deletes them.
        self._x_file = tempfile.TemporaryFile(prefix="mixreg-upload-X-")  # noqa: SIM115
        self._y_file = tempfile.TemporaryFile(prefix="mixreg-upload-y-")  # noqa: SIM115
        self._extra_file = (
            tempfile.TemporaryFile(prefix="mixreg-upload-extra-")  # noqa: SIM115
            if self.kept
            else None
        )
        self._extra_writer: Any = None

    @property
    def n_features(self) -> int:
        """Columns of X."""
        return len(self.feature_names)

    @property
    def extra_columns(self) -> list[dict[str, str]]:
        """The kept columns with their types, ``{"name": ..., "type": "number" | "string"}``:
        a CSV column is ``number`` when every value is a number or empty."""
        return [
            {"name": name, "type": NUMBER if self._numeric[name] else STRING} for name in self.kept
        ]

    def append(self, X: FloatArray, y: FloatArray, extra: Mapping[str, Any] | None = None) -> None:
        """Check the next block of rows and add it, with the block's values of every kept
        column (``extra``: a 1-D array or pyarrow array per name).

        Raises ``IngestError`` naming the row (counted over the whole upload) that is not
        finite or too large, and ``DatasetTooLargeError`` past the row or byte limit.
        """
        if X.ndim != 2 or X.shape[1] != self.n_features or y.shape != (X.shape[0],):
            raise ValueError(f"a block of shape {X.shape} and {y.shape} does not fit the dataset")
        batch = self._extra_batch(extra or {}, len(y)) if self.kept else None
        self.limits.check_rows(
            self.n_rows + len(y), self.n_features, self._extra_bytes_with(len(y))
        )
        check_finite_matrix(X, row_offset=self.n_rows)
        check_finite_vector(y, offset=self.n_rows)
        check_fittable_scale(X, y, row_offset=self.n_rows)
        self._x_file.write(np.ascontiguousarray(X, dtype="<f8").data)
        self._y_file.write(np.ascontiguousarray(y, dtype="<f8").data)
        if batch is not None:
            self._write_extra(batch)
        self.n_rows += len(y)

    def _extra_bytes_with(self, n_new: int) -> int:
        """Bytes of the kept values with ``n_new`` more rows: 8 per number, a text's UTF-8
        length (the new block's texts are counted already)."""
        return sum(
            8 * (self.n_rows + n_new) if self._numeric[name] else self._text_bytes[name]
            for name in self.kept
        )

    def _extra_batch(self, extra: Mapping[str, Any], n_rows: int) -> Any:
        """The block's kept values as a record batch (TEXT as strings, trimmed, empty as
        missing), updating the inferred types and the text bytes.

        Every text's length is checked, and the bytes of the kept values counted against the
        limits, before a dictionary-encoded column is expanded: a few bytes of dictionary
        indices may stand for gigabytes of text.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if set(extra) != set(self.kept):
            raise ValueError(
                f"a block brings the kept columns {sorted(extra)}, not {list(self.kept)}"
            )
        arrays = []
        for name, arrival in self.kept.items():
            values = extra[name]
            if arrival == NUMBER:
                array = pa.array(np.asarray(values, dtype=np.float64), pa.float64())
            else:
                array = (
                    values
                    if isinstance(values, pa.Array)
                    else pa.array(np.asarray(values, dtype=object), pa.string())
                )
                if arrival == TEXT:
                    array = pc.utf8_trim_whitespace(array.cast(pa.string()))
                    array = pc.if_else(pc.equal(array, ""), pa.scalar(None, pa.string()), array)
                    if self._numeric[name] and not reads_as_numbers(array):
                        self._numeric[name] = False
                self._check_text_widths(name, array)
                self._text_bytes[name] += text_bytes(array)
            if len(array) != n_rows:
                raise ValueError(f"kept column '{name}' has {len(array)} values for {n_rows} rows")
            arrays.append(array)
        self.limits.check_rows(
            self.n_rows + n_rows, self.n_features, self._extra_bytes_with(n_rows)
        )
        arrays = [
            array if self.kept[name] == NUMBER else array.cast(pa.string())
            for name, array in zip(self.kept, arrays, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, names=list(self.kept))

    def _check_text_widths(self, name: str, array: Any) -> None:
        """Raise naming the column and the first data row of a text longer than the limit."""
        import pyarrow.compute as pc

        limit = self.limits.max_text_cell_chars
        if limit is None or len(array) == 0:
            return
        lengths = text_lengths(array, pc.utf8_length)
        longest = pc.max(lengths).as_py()
        if longest is None or longest <= limit:
            return
        too_long = lengths.fill_null(0).to_numpy(zero_copy_only=False) > limit
        at = int(np.flatnonzero(too_long)[0])
        self.limits.check_text_width(
            int(lengths[at].as_py()), column=name, row=self.n_rows + at + 1
        )

    def _write_extra(self, batch: Any) -> None:
        import pyarrow as pa

        if self._extra_writer is None:
            self._extra_writer = pa.ipc.new_stream(
                pa.PythonFile(self._extra_file, mode="w"), batch.schema
            )
        self._extra_writer.write_batch(batch)

    def _finish_extras(self) -> None:
        if self._extra_writer is not None:
            self._extra_writer.close()
            self._extra_writer = None

    def blocks(self, rows: int) -> Iterator[tuple[FloatArray, FloatArray]]:
        """The staged rows, ``rows`` at a time, in order."""
        self._x_file.seek(0)
        self._y_file.seek(0)
        row_bytes = 8 * self.n_features
        for start in range(0, self.n_rows, rows):
            count = min(rows, self.n_rows - start)
            X = np.frombuffer(self._x_file.read(count * row_bytes), dtype="<f8")
            y = np.frombuffer(self._y_file.read(count * 8), dtype="<f8")
            yield (
                X.astype(np.float64).reshape(count, self.n_features),
                y.astype(np.float64),
            )

    def with_extras(self) -> Iterator[tuple[FloatArray, FloatArray, dict[str, NDArray[Any]]]]:
        """The staged rows in the blocks they were appended in, each with its kept values:
        float64 for a number column (NaN where missing), an object array of ``str`` (``None``
        where missing) for a string one."""
        import pyarrow as pa

        if self._extra_file is None or self.n_rows == 0:
            for X, y in self.blocks(max(self.n_rows, 1)):
                yield X, y, {}
            return
        self._finish_extras()
        self._extra_file.seek(0)
        self._x_file.seek(0)
        self._y_file.seek(0)
        for batch in pa.ipc.open_stream(pa.PythonFile(self._extra_file, mode="r")):
            count = batch.num_rows
            X = np.frombuffer(self._x_file.read(count * 8 * self.n_features), dtype="<f8")
            y = np.frombuffer(self._y_file.read(count * 8), dtype="<f8")
            extra: dict[str, NDArray[Any]] = {}
            for index, name in enumerate(self.kept):
                column = batch.column(index)
                if self._numeric[name]:
                    extra[name] = float_values(column)
                else:
                    extra[name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
            yield (
                X.astype(np.float64).reshape(count, self.n_features),
                y.astype(np.float64),
                extra,
            )

    def to_parsed(self) -> ParsedDataset:
        """All the staged rows as one pair of arrays, with the kept columns (for small data)."""
        X = np.empty((self.n_rows, self.n_features), dtype=np.float64)
        y = np.empty(self.n_rows, dtype=np.float64)
        extra = {
            column["name"]: np.empty(
                self.n_rows, np.float64 if column["type"] == NUMBER else object
            )
            for column in self.extra_columns
        }
        start = 0
        for X_block, y_block, extra_block in self.with_extras():
            stop = start + len(y_block)
            X[start:stop], y[start:stop] = X_block, y_block
            for name, values in extra_block.items():
                extra[name][start:stop] = values
            start = stop
        return ParsedDataset(
            X=X,
            y=y,
            feature_names=list(self.feature_names),
            target_name=self.target_name,
            extra=extra,
        )

    def close(self) -> None:
        """Delete the temporary files."""
        self._x_file.close()
        self._y_file.close()
        if self._extra_file is not None:
            self._extra_writer = None
            self._extra_file.close()

    def __enter__(self) -> StagedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def text_lengths(array: Any, measure: Any) -> Any:
    """``measure`` (``utf8_length`` or ``binary_length``) of each value of a text array; of a
    dictionary-encoded one without expanding it (its dictionary measured, then taken)."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        return measure(array.dictionary).take(array.indices)
    return measure(array)


def text_bytes(array: Any) -> int:
    """The UTF-8 bytes of a text array's values, as they take once expanded."""
    import pyarrow.compute as pc

    return int(pc.sum(text_lengths(array, pc.binary_length)).as_py() or 0)


def reads_as_numbers(texts: Any) -> bool:
    """Whether every present value of a string array reads as a float."""
    import pyarrow as pa

    try:
        texts.cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def float_values(column: Any) -> FloatArray:
    """A number column (or text that reads as numbers) as float64, NaN where missing."""
    import pyarrow as pa

    numbers = column.cast(pa.float64()).fill_null(float("nan"))
    return np.asarray(numbers.to_numpy(zero_copy_only=False), dtype=np.float64)


def staged_dataset(
    feature_names: list[str],
    target_name: str | None,
    limits: DatasetLimits,
    kept: Mapping[str, str] | None = None,
) -> StagedDataset:
    return StagedDataset(
        feature_names=feature_names, target_name=target_name, limits=limits, kept=kept
    )


def dropped_text(dropped: Mapping[str, int]) -> str:
    return ", ".join(f"'{column}' {count}" for column, count in dropped.items())


def count_dropped(staged: StagedDataset, missing: NDArray[np.bool_], names: list[str]) -> None:
    """Add the rows of ``missing`` (rows x used columns) to the counts of their columns."""
    for name, count in zip(names, missing.sum(axis=0).tolist(), strict=True):
        if count:
            staged.dropped_rows[name] = staged.dropped_rows.get(name, 0) + int(count)


def release_arrow_memory() -> None:
    """Hand the memory pyarrow pooled while reading back to the system: the process keeps
    serving, and the next upload may be much smaller."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
