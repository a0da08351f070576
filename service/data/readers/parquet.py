"""The Parquet reader: row groups read in batches, number columns checked and staged, kept
text columns read back in slices of about ``ingest.BLOCK_BYTES``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.checks import FINITE_HINT, IngestError, describe_non_finite
from service.data import ingest
from service.data.column_choice import EVERY_COLUMN, ColumnChoice, check_column_names
from service.data.ingest import NO_LIMITS, BinaryFile, DatasetLimits
from service.data.staging import (
    NUMBER,
    STRING,
    StagedDataset,
    float_values,
    release_arrow_memory,
    staged_dataset,
    text_lengths,
)

FloatArray = NDArray[np.float64]

PARQUET_MAGIC = b"PAR1"


def read_parquet(
    source: BinaryFile,
    *,
    target: str | None,
    limits: DatasetLimits = NO_LIMITS,
    choice: ColumnChoice = EVERY_COLUMN,
) -> StagedDataset:
    """Read a Parquet file whose column ``target`` is the target and whose other columns (or
    those of ``choice``), all of numbers (integers or floats), are the features; row groups
    are read one at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pa_parquet

    try:
        parquet_file = pa_parquet.ParquetFile(source)
        schema = parquet_file.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IngestError(f"file is not a readable Parquet file: {exc}") from None
    columns = list(schema.names)
    if not columns:
        raise IngestError("Parquet file has no columns")
    feature_names = check_column_names(
        columns,
        source="Parquet file",
        what="Parquet file",
        target=target,
        limits=limits,
        choice=choice,
    )
    assert target is not None  # checked with the columns
    used = [*feature_names, target]
    for column in (schema.field(name) for name in used):
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            raise IngestError(
                f"Parquet column '{column.name}' holds {column.type}, not numbers; the features "
                f"and the target must hold integers or floats (leave a column out with ignore)"
            )
    kept = {name: _parquet_kept_type(schema.field(name)) for name in choice.keep}
    texts = [name for name, kept_type in kept.items() if kept_type == STRING]
    if texts:
        # Kept texts are read as dictionaries (as they are usually stored), so that their
        # lengths and bytes are checked before they are expanded.
        source.seek(0)
        parquet_file = pa_parquet.ParquetFile(source, read_dictionary=texts)
    text_bytes, text_row_bytes = _parquet_text_sizes(parquet_file.metadata, texts)
    # The row count of the file's footer, and the bytes the kept texts take uncompressed (at
    # least, as stored): too many rows or bytes are refused before any row group is
    # decompressed.
    limits.check_rows(parquet_file.metadata.num_rows, len(feature_names), text_bytes)
    staged = staged_dataset(feature_names, target, limits, kept)
    try:
        # Each batch holds the used columns in that order: the features, the target, then the
        # kept columns.
        batch_rows = max(
            1, ingest.BLOCK_BYTES // (8 * (len(feature_names) + 1 + len(kept)) + text_row_bytes)
        )
        batches = parquet_file.iter_batches(batch_size=batch_rows, columns=[*used, *kept])
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise IngestError(
                    f"Parquet file cannot be read past row {staged.n_rows}: {exc}"
                ) from None
            if batch is None:
                break
            _check_parquet_values(batch, used, first_row=staged.n_rows + 1)
            X = np.empty((batch.num_rows, len(feature_names)), dtype=np.float64)
            for position in range(len(feature_names)):
                X[:, position] = batch.column(position).to_numpy(zero_copy_only=False)
            y = np.asarray(batch.column(len(used) - 1).to_numpy(zero_copy_only=False), np.float64)
            extra = {name: _parquet_kept_values(batch.column(name), kept[name]) for name in kept}
            for start, stop in _text_slices(extra, batch.num_rows):
                staged.append(
                    X[start:stop],
                    y[start:stop],
                    {name: values[start:stop] for name, values in extra.items()},
                )
        if staged.n_rows == 0:
            raise IngestError("Parquet file has no rows")
    except BaseException:
        staged.close()
        raise
    finally:
        release_arrow_memory()
    return staged


def _parquet_kept_type(column: Any) -> str:
    """``NUMBER`` for a kept Parquet column of integers or floats, ``STRING`` for one of text
    (plain, large or dictionary-encoded); raises naming a column of any other type."""
    import pyarrow as pa

    value_type = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_integer(value_type) or pa.types.is_floating(value_type):
        return NUMBER
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return STRING
    raise IngestError(
        f"keep names the Parquet column '{column.name}', which holds {column.type}; a kept "
        f"column must hold numbers (integers or floats) or text"
    )


def _parquet_kept_values(array: Any, kept_type: str) -> Any:
    """A kept Parquet column's values: float64 with NaN where missing, or strings (left
    dictionary-encoded: the staged dataset checks them before it expands them)."""
    import pyarrow as pa

    if kept_type == STRING:
        return array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return float_values(array)


def _parquet_text_sizes(metadata: Any, texts: Sequence[str]) -> tuple[int, int]:
    """The uncompressed bytes of the columns ``texts`` in every row group, and the most of
    them per row in a row group (to size the blocks read)."""
    total, per_row = 0, 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        stored = sum(
            row_group.column(index).total_uncompressed_size
            for index in range(row_group.num_columns)
            if row_group.column(index).path_in_schema in texts
        )
        total += stored
        per_row = max(per_row, -(-stored // max(row_group.num_rows, 1)))
    return total, per_row


def _text_slices(extra: Mapping[str, Any], n_rows: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of a block whose kept texts each expand to about
    ``ingest.BLOCK_BYTES`` at most (a range of one row may take more), so that a block of
    dictionary indices is never expanded whole."""
    import pyarrow as pa
    import pyarrow.compute as pc

    row_bytes = np.zeros(n_rows, dtype=np.int64)
    for values in extra.values():
        if isinstance(values, pa.Array) and pa.types.is_dictionary(values.type):
            lengths = text_lengths(values, pc.binary_length).fill_null(0)
            row_bytes += np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)
    if n_rows == 0 or int(row_bytes.sum()) <= ingest.BLOCK_BYTES:
        return [(0, n_rows)]
    ends = np.cumsum(row_bytes)
    slices, start = [], 0
    while start < n_rows:
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + ingest.BLOCK_BYTES, side="right"))
        stop = max(stop, start + 1)
        slices.append((start, min(stop, n_rows)))
        start = stop
    return slices


def _check_parquet_values(batch: Any, columns: list[str], *, first_row: int) -> None:
    """Raise naming the first missing (null) or non-finite value of the batch; rows are
    counted from 1 over the whole file."""
    for index, column in enumerate(columns):
        array = batch.column(index)
        if array.null_count:
            row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise IngestError(
                f"Parquet row {first_row + row}, column '{column}' is missing (null); {FINITE_HINT}"
            )
        values = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = int(bad[0])
            raise IngestError(
                f"Parquet row {first_row + row}, column '{column}' is "
                f"{describe_non_finite(float(values[row]))}; {FINITE_HINT}"
            )
